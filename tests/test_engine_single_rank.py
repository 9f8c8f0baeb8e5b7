"""One rank with fp32 compute: the model runs without an FSDP wrapper, and trains, offloads, generates and
checkpoints exactly as the wrapped model does (a checkpoint it writes loads into a sharded engine)."""

import pytest
import torch
from distributed import run_ranks
from engine_checks import assert_grads_close, full_grads, full_params
from tiny import make_micro_batches, reference_grads, tiny_qwen2, token_loss

pytestmark = pytest.mark.slow


def _train(engine, steps=2):
    for step in range(steps):
        with engine.train_mode():
            engine.forward_backward_batch(make_micro_batches(step, 3), token_loss)
            if step == 0:
                grads = full_grads(engine)
            engine.optimizer_step()
    return grads


def _one_rank(rank, checkpoint_dir):
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    from engine import EngineConfig, FSDPEngine

    def fsdp_modules(engine):
        return sum(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in engine.module.modules())

    plain = FSDPEngine(tiny_qwen2, EngineConfig(lr=1e-2))
    wrapped = FSDPEngine(tiny_qwen2, EngineConfig(lr=1e-2, wrap_single_rank=True))
    offloaded = FSDPEngine(tiny_qwen2, EngineConfig(lr=1e-2, param_offload=True, optimizer_offload=True))
    bf16 = FSDPEngine(tiny_qwen2, EngineConfig(lr=1e-2, mixed_precision="bf16", frozen=True))
    report = {"versions": [e.fsdp_version for e in (plain, wrapped, offloaded, bf16)],
              "units": plain.num_sharded_units, "fsdp_modules": [fsdp_modules(e) for e in (plain, wrapped, bf16)],
              "grads": {name: _train(e) for name, e in (("plain", plain), ("wrapped", wrapped),
                                                        ("offloaded", offloaded))},
              "params": {name: full_params(e) for name, e in (("plain", plain), ("wrapped", wrapped),
                                                              ("offloaded", offloaded))},
              "offloaded_residency": offloaded.residency()}
    prompt = torch.tensor([[5, 7, 11, 13]])
    with plain.eval_mode(), wrapped.eval_mode():
        report["generated"] = [e.generate(input_ids=prompt, max_new_tokens=4, do_sample=False).tolist()
                               for e in (plain, wrapped)]
    plain.save_checkpoint(checkpoint_dir)
    return report


def _load_sharded(rank, checkpoint_dir):
    from engine import EngineConfig, FSDPEngine

    engine = FSDPEngine(tiny_qwen2, EngineConfig(lr=1e-2))
    engine.load_checkpoint(checkpoint_dir)
    loaded = full_params(engine)
    with engine.train_mode():  # the optimizer state came along: a step runs
        engine.forward_backward_batch(make_micro_batches(9 + rank, 1), token_loss)
        engine.optimizer_step()
    return {"version": engine.fsdp_version, "step": engine.global_step, "params": loaded}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """The 1-rank spawn's report and the checkpoint it wrote; each test below checks one property of them."""
    checkpoint_dir = tmp_path_factory.mktemp("single-rank") / "ckpt"
    return run_ranks(_one_rank, str(checkpoint_dir), world_size=1)[0], checkpoint_dir


def test_one_rank_runs_unwrapped(one_rank):
    report, _ = one_rank
    assert report["versions"] == [0, 2, 0, 2]  # bf16 compute keeps FSDP, which does the casting
    assert report["units"] == 0 and report["fsdp_modules"][0] == 0 and report["fsdp_modules"][1] > 0
    assert report["fsdp_modules"][2] > 0


def test_one_rank_gradients_match_the_reference(one_rank):
    report, _ = one_rank
    want = reference_grads([make_micro_batches(0, 3)])
    for grads in report["grads"].values():
        assert_grads_close(grads, want)


def test_one_rank_trains_offloads_and_generates_as_the_wrapped_model(one_rank):
    report, _ = one_rank
    for name in ("wrapped", "offloaded"):
        assert_grads_close(report["params"]["plain"], report["params"][name], atol=1e-6, rtol=1e-5)
    assert report["offloaded_residency"] == {"params": "cpu", "optimizer": "cpu"}
    assert report["generated"][0] == report["generated"][1]


def test_a_checkpoint_of_the_unwrapped_model_loads_sharded_and_training_goes_on(one_rank):
    # A checkpoint of the unwrapped model loads into a sharded one (2 ranks, FSDP2) and training goes on.
    report, checkpoint_dir = one_rank
    loaded = run_ranks(_load_sharded, str(checkpoint_dir))
    assert [r["version"] for r in loaded] == [2, 2] and [r["step"] for r in loaded] == [3, 3]
    for r in loaded:
        assert_grads_close(r["params"], report["params"]["plain"], atol=0, rtol=0)
