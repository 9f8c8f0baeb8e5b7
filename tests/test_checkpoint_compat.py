"""A checkpoint written by the engine before its modules moved into engine/fsdp, engine/runtime and
engine/checkpoint (tests/data/checkpoint_v1, written by tests/scripts/make_v1_checkpoint.py at commit 744b2d7)
still loads: same weights to the last bit, same step, optimizer state and schedule, and training continues."""

import json
from pathlib import Path

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow
OLD = Path(__file__).parent / "data" / "checkpoint_v1"


def _load_old(rank, directory):
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from engine import EngineConfig, FSDPEngine
    from engine.tiny_model import tiny_qwen2

    engine = FSDPEngine(lambda: tiny_qwen2(seed=0, vocab_size=64, hidden_size=32, max_positions=32),
                        EngineConfig(fsdp_version=2, lr=1e-2))
    engine.load_checkpoint(Path(directory) / "step_000002")
    full = get_model_state_dict(engine.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    sums = {name: float(t.double().sum()) for name, t in full.items()}
    states = [s for s in engine.optimizer.state.values() if "exp_avg" in s]
    with engine.train_mode():
        ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(rank))
        engine.forward_backward_batch([ids], lambda m, b: (m(input_ids=b, labels=b).loss, b.numel()))
        norm = engine.optimizer_step()
    return {"sums": sums, "step": engine.global_step, "optimizer_states": len(states), "grad_norm": norm}


def test_a_checkpoint_from_before_the_layers_moved_still_loads():
    expected = json.loads((OLD / "expected.json").read_text())
    results = run_ranks(_load_old, str(OLD))
    assert results[0]["sums"] == expected["sums"], "the weights differ from what the old engine saved"
    for result in results:  # the full state dict lands on rank 0 only; every rank loaded its shards and stepped
        assert result["step"] == expected["step"] + 1  # the saved step, then one more taken here
        assert result["optimizer_states"] > 0 and result["grad_norm"] > 0
