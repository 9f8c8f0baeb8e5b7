"""The engine on a real GPU (one process, nccl, bf16): run where the cuda backend is available, else skipped."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.cuda


def _train_on_gpu(rank, fsdp_version, offload):
    import math

    from tiny import make_micro_batches, tiny_qwen2, token_loss

    from engine import EngineConfig, FSDPEngine

    config = EngineConfig(fsdp_version=fsdp_version, lr=1e-3, param_offload=offload, optimizer_offload=offload)
    engine = FSDPEngine(tiny_qwen2, config)
    assert engine.backend.name == "cuda" and engine.backend.dist_backend == "nccl"
    losses = []
    for step in range(3):
        with engine.train_mode():
            losses.append(engine.forward_backward_batch(make_micro_batches(step, 4), token_loss)["loss"])
            norm = engine.optimizer_step()
            assert math.isfinite(norm)
    assert engine.residency() == ({"params": "cpu", "optimizer": "cpu"} if offload else
                                  {"params": "device", "optimizer": "device"})
    return losses, engine.last_metrics["peak_memory_gib"]


@pytest.mark.parametrize("fsdp_version,offload", [(1, False), (2, False), (2, True)])
def test_engine_trains_on_one_gpu(fsdp_version, offload):
    losses, peak = run_ranks(_train_on_gpu, fsdp_version, offload, world_size=1, env={"ACCEL_BACKEND": "cuda"},
                           fresh=True)[0]  # a GPU's peak memory: a process of its own
    assert all(loss == loss for loss in losses) and peak > 0
