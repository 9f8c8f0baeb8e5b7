"""Collective counts per mini-batch (counts, not times): deferred sync reduces once per sharded unit."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow


def _count(rank, fsdp_version, modes):
    from engine_checks import CollectiveCounter
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    from engine import EngineConfig, FSDPEngine

    batches = make_micro_batches(seed=rank, count=4)
    out = {}
    for mode, options in modes.items():
        engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=fsdp_version, **options))
        with engine.train_mode():
            engine.forward_backward_batch(batches, token_loss)  # warm-up: lazy init issues its own collectives
            engine.zero_grad()
            with CollectiveCounter() as counter:
                engine.forward_backward_batch(batches, token_loss)
        out[mode] = dict(counter.counts, units=engine.num_sharded_units)
    return out


FSDP2_MODES = {
    "every_micro_batch": {"grad_sync": "every_micro_batch"},
    "deferred": {"grad_sync": "deferred"},
    "kept_unsharded": {"grad_sync": "deferred", "keep_params_unsharded": True},
}


def test_fsdp2_collective_counts():
    counts = run_ranks(_count, 2, FSDP2_MODES)[0]
    print("FSDP2, 4 micro-batches:", counts)
    units = counts["deferred"]["units"]
    assert units == 3  # two decoder layers and the root
    assert counts["every_micro_batch"]["reduce_scatter"] == units * 4
    assert counts["deferred"]["reduce_scatter"] == units
    assert counts["kept_unsharded"]["reduce_scatter"] == units
    assert counts["kept_unsharded"]["all_gather"] < counts["deferred"]["all_gather"]
    assert counts["deferred"]["all_gather"] == counts["every_micro_batch"]["all_gather"]
    for mode in FSDP2_MODES:
        # weights and metrics with their key fingerprint, per mini-batch: int64 and float32, issued together
        assert counts[mode]["all_reduce"] == 2


def test_fsdp1_collective_counts():
    modes = {k: v for k, v in FSDP2_MODES.items() if k != "kept_unsharded"}
    counts = run_ranks(_count, 1, modes)[0]
    print("FSDP1, 4 micro-batches:", counts)
    units = counts["deferred"]["units"]
    assert units == 3
    assert counts["every_micro_batch"]["reduce_scatter"] == units * 4
    assert counts["deferred"]["reduce_scatter"] == units
    assert counts["deferred"]["all_reduce"] == 2  # fingerprint and values, int64 + float32 (runtime/metric_reduce.py)
