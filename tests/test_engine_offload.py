"""The offload-aware fast path and offload itself, counted (moves, gc.collect, empty_cache), on 2 real ranks."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow


class _Recorder:
    """Observer of the engine's events (a pluggy plugin)."""

    def __init__(self):
        self.transfers = []

    from accel_backends import hookimpl

    @hookimpl
    def on_transfer(self, engine, what, destination, num_bytes):
        self.transfers.append((what, destination, num_bytes))


def _count_calls(monkeypatch_targets):
    """Wrap (object, attribute) pairs so each call is counted; returns the counter."""
    from collections import Counter

    counts = Counter()
    for owner, name in monkeypatch_targets:
        original = getattr(owner, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        setattr(owner, name, counted)
    return counts


def _fast_path(rank, fsdp_version):
    import gc

    from engine_checks import CopyingCPUBackend
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    import accel_backends
    from engine import EngineConfig, FSDPEngine

    backend = CopyingCPUBackend()
    engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=fsdp_version), backend=backend)
    recorder = _Recorder()
    accel_backends.register_plugin(recorder)
    counts = _count_calls([(gc, "collect"), (backend, "empty_cache"), (backend, "synchronize"),
                           (backend, "to_device"), (backend, "to_host")])
    batches = make_micro_batches(seed=rank, count=2)
    for _ in range(3):
        with engine.train_mode():
            engine.forward_backward_batch(batches, token_loss)
            engine.optimizer_step()
        with engine.eval_mode():
            engine.forward_backward_batch(batches, token_loss, forward_only=True)
    return {"calls": dict(counts), "transfers": recorder.transfers, "moves": dict(backend.moves)}


@pytest.mark.parametrize("fsdp_version", [1, 2])
def test_no_offload_means_no_work_on_mode_switches(fsdp_version):
    for result in run_ranks(_fast_path, fsdp_version):
        assert result["calls"] == {}, "no gc.collect, empty_cache, synchronize or move may happen"
        assert result["transfers"] == [] and result["moves"] == {}


def _offload(rank, fsdp_version):
    from engine_checks import assert_bitwise_equal, local_state
    from tiny import make_micro_batches, token_loss
    from tiny import tiny_uneven_qwen2 as tiny_qwen2

    import accel_backends
    from engine import EngineConfig, FSDPEngine

    # The strict stand-in: host copies land only at synchronize(), as a DMA does; dims no world size divides.
    backend = accel_backends.get_backend("strict")
    reference = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=fsdp_version, lr=1e-3), backend=backend)
    built = local_state(reference)
    config = EngineConfig(fsdp_version=fsdp_version, param_offload=True, optimizer_offload=True, lr=1e-3)
    engine = FSDPEngine(tiny_qwen2, config, backend=backend)
    assert engine.residency() == {"params": "cpu", "optimizer": "cpu"}
    assert_bitwise_equal(built, local_state(engine))  # offloaded at construction: every shard as built
    assert engine.is_param_offload_enabled and engine.is_optimizer_offload_enabled
    recorder = _Recorder()
    accel_backends.register_plugin(recorder)
    batches = make_micro_batches(seed=rank, count=2)
    report = {}

    with engine.train_mode():
        assert engine.residency() == {"params": "device", "optimizer": "device"}
        assert_bitwise_equal(built, local_state(engine))
        with engine.train_mode(disable_auto_offload=True):  # an inner context leaves residency alone
            losses = [engine.forward_backward_batch(batches, token_loss)["loss"]]
            engine.optimizer_step()
        engine.to("device")  # already there: nothing moves
    report["train_transfers"] = [(w, d) for w, d, _ in recorder.transfers]
    assert engine.residency() == {"params": "cpu", "optimizer": "cpu"}

    recorder.transfers.clear()
    with engine.eval_mode():
        assert engine.residency() == {"params": "device", "optimizer": "cpu"}
    report["eval_transfers"] = [(w, d) for w, d, _ in recorder.transfers]

    # Bitwise round trip of parameters and (now non-empty) optimizer state.
    before = local_state(engine)
    engine.to("device")
    engine.to("cpu")
    assert_bitwise_equal(before, local_state(engine))

    # Offloading changes nothing numerically: the same steps without offload give the same losses.
    with engine.train_mode():
        losses.append(engine.forward_backward_batch(batches, token_loss)["loss"])
        engine.optimizer_step()
    ref_losses = []
    for _ in range(2):
        with reference.train_mode():
            ref_losses.append(reference.forward_backward_batch(batches, token_loss)["loss"])
            reference.optimizer_step()
    report["losses"], report["ref_losses"] = losses, ref_losses
    report["bytes"] = [n for _, _, n in recorder.transfers]
    return report


@pytest.mark.parametrize(("fsdp_version", "world_size"), [(1, 2), (2, 2), (2, 3)])
def test_offload_moves_exactly_the_offloaded_parts_once(fsdp_version, world_size):
    """Under the strict device, on shards the world size does not divide: bitwise round trips, the same losses."""
    for report in run_ranks(_offload, fsdp_version, world_size=world_size, env={"ACCEL_BACKEND": "strict"}):
        assert report["train_transfers"] == [
            ("params", "device"), ("optimizer", "device"), ("params", "cpu"), ("optimizer", "cpu")]
        assert report["eval_transfers"] == [("params", "device"), ("params", "cpu")]
        assert report["losses"] == report["ref_losses"]
