"""Faults: a micro-batch that raises, a NaN loss, a save that dies part-way, and resume parity."""

import pytest

from distributed import run_ranks

pytestmark = pytest.mark.slow


class BadBatch(Exception):
    pass


def _raising_step(module, batch):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    from tiny import token_loss

    if batch.get("poison") == "mid_forward":
        # Fails inside the forward, after FSDP gathered the last decoder layer and before it ran.
        last_layer = [m for m in module.modules() if isinstance(m, Qwen2DecoderLayer)][-1]
        hook = last_layer.register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(BadBatch("mid-forward")))
        try:
            return token_loss(module, batch)
        finally:
            hook.remove()
    loss, count = token_loss(module, batch)  # the forward runs (parameters gathered), then the step fails
    if batch.get("poison"):
        raise BadBatch("malformed micro-batch")
    return loss, count


def _raising_micro_batch(rank, fsdp_version):
    from torch.distributed.tensor import DTensor

    from engine import EngineConfig, FSDPEngine, compat
    from engine.grad_sync import gradient_sync_enabled
    from engine_checks import assert_grads_close, full_grads
    from tiny import make_micro_batches, reference_grads, tiny_qwen2, token_loss

    worst = []
    per_rank = [make_micro_batches(seed=10 + r, count=4) for r in range(2)]
    expected = reference_grads(per_rank)
    # FSDP2 also fails inside the forward (the last layer gathered), and with parameters kept unsharded between
    # micro-batches: every unit must be resharded then, not only the root.
    cases = [(False, "after_forward"), (False, "mid_forward"), (True, "mid_forward")]
    for keep_unsharded, where in (cases if fsdp_version == 2 else cases[:1]):
        engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=fsdp_version, grad_sync="deferred",
                                                     keep_params_unsharded=keep_unsharded))
        poisoned = make_micro_batches(seed=99, count=4)
        poisoned[2] = dict(poisoned[2], poison=where)
        with engine.train_mode():
            with pytest.raises(BadBatch):
                engine.forward_backward_batch(poisoned, _raising_step)
            assert gradient_sync_enabled(engine.module, fsdp_version), "sync must be restored after the failure"
            assert all(p.grad is None for p in engine.module.parameters()), "partial gradients are dropped"
            if fsdp_version == 2:
                units = compat.fsdp2_units(engine.module)
                assert len(units) == 3, "the root and two decoder layers"
                # A sharded unit registers its DTensor shards as parameters; an unsharded one plain tensors.
                unsharded = [name for name, p in engine.module.named_parameters() if not isinstance(p, DTensor)]
                assert not unsharded, f"still unsharded after the failure: {unsharded}"
                assert all(compat.reshard_after_backward(u) for u in units), "reshard-after-backward restored"
                assert compat.is_last_backward(engine.module), "the next backward is a last one again"
            # The engine stays usable: the next mini-batch gives exactly the reference gradients (no stale
            # gradient of the failed mini-batch survives).
            engine.forward_backward_batch(per_rank[rank], token_loss)
            worst.append(assert_grads_close(full_grads(engine), expected))
            engine.optimizer_step()
    return worst


@pytest.mark.parametrize("fsdp_version", [1, 2])
def test_a_raising_micro_batch_restores_sync_and_leaves_the_engine_usable(fsdp_version):
    run_ranks(_raising_micro_batch, fsdp_version)


def _nan_step(module, batch):
    from tiny import token_loss

    loss, count = token_loss(module, batch)
    return loss * float("nan"), count


def _nan_loss(rank):
    import math

    import accel_backends
    from engine import EngineConfig, FSDPEngine
    from engine_checks import assert_bitwise_equal, local_state
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    steps = []

    class Observer:
        @accel_backends.hookimpl
        def on_optimizer_step(self, engine, step, metrics):
            steps.append(dict(metrics))

    accel_backends.register_plugin(Observer())
    engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2, lr=1e-2))
    batches = make_micro_batches(seed=rank, count=2)
    with engine.train_mode():
        engine.forward_backward_batch(batches, token_loss)
        engine.optimizer_step()  # creates optimizer state, so "unchanged" covers it too
        before = local_state(engine)
        lr_before = engine.scheduler.get_last_lr()
        metrics = engine.forward_backward_batch(batches, _nan_step)
        norm = engine.optimizer_step()
        assert math.isnan(metrics["loss"]) and not math.isfinite(norm)
        assert_bitwise_equal(before, local_state(engine))
        assert engine.scheduler.get_last_lr() == lr_before
        assert engine.last_step_metrics["skipped"] and engine.skipped_steps == 1
        assert all(p.grad is None for p in engine.module.parameters())
        engine.forward_backward_batch(batches, token_loss)
        assert math.isfinite(engine.optimizer_step())
    return [s["skipped"] for s in steps]


def test_nan_loss_skips_the_step_and_leaves_weights_unchanged():
    for skipped in run_ranks(_nan_loss):
        assert skipped == [False, True, False]


def _train(engine, steps, rank):
    from tiny import make_micro_batches, token_loss

    losses = []
    for step in range(steps):
        with engine.train_mode():
            batches = make_micro_batches(seed=100 * engine.global_step + rank, count=2)
            losses.append(engine.forward_backward_batch(batches, token_loss)["loss"])
            engine.optimizer_step()
    return losses


def _resume(rank, root, fsdp_version, lora):
    import torch

    from engine import EngineConfig, FSDPEngine
    from tiny import tiny_qwen2

    def config():
        return EngineConfig(fsdp_version=fsdp_version, lr=1e-3, lr_schedule="cosine", warmup_steps=1,
                            total_steps=6, lora_rank=4 if lora else 0)

    straight = FSDPEngine(tiny_qwen2, config())
    uninterrupted = _train(straight, 4, rank)

    first = FSDPEngine(tiny_qwen2, config())
    part1 = _train(first, 2, rank)
    first.save_checkpoint(f"{root}/ckpt")
    torch.manual_seed(12345)  # disturb the RNG: loading must restore it
    second = FSDPEngine(tiny_qwen2, config())
    second.load_checkpoint(f"{root}/ckpt")
    assert second.global_step == 2
    part2 = _train(second, 2, rank)
    return uninterrupted, part1 + part2


@pytest.mark.parametrize("fsdp_version,lora", [(1, False), (2, False), (2, True)])
def test_save_load_continue_matches_an_uninterrupted_run(tmp_path, fsdp_version, lora):
    for uninterrupted, resumed in run_ranks(_resume, str(tmp_path), fsdp_version, lora):
        assert resumed == pytest.approx(uninterrupted, rel=1e-6, abs=1e-7)


def _interrupted_save(rank, root):
    import engine.checkpoint as checkpoint
    from engine import EngineConfig, FSDPEngine
    from engine_checks import full_params
    from tiny import tiny_qwen2

    engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2, lr=1e-2))
    _train(engine, 1, rank)
    engine.save_checkpoint(f"{root}/ckpt")
    saved = full_params(engine)
    _train(engine, 1, rank)

    original = checkpoint.write_extra_state

    def dies_part_way(engine_, directory):
        if rank == 1:
            raise OSError("disk full")
        original(engine_, directory)

    checkpoint.write_extra_state = dies_part_way
    try:
        with pytest.raises(RuntimeError, match="previous checkpoint there is untouched"):
            engine.save_checkpoint(f"{root}/ckpt")
    finally:
        checkpoint.write_extra_state = original

    fresh = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2, lr=1e-2))
    fresh.load_checkpoint(f"{root}/ckpt")
    loaded = full_params(fresh)
    same = all(bool((loaded[k] == saved[k]).all()) for k in saved)
    engine.save_checkpoint(f"{root}/ckpt")  # the next save succeeds and replaces the stale partial
    return same, fresh.global_step


def test_interrupted_save_leaves_previous_checkpoint_loadable(tmp_path):
    for same, step in run_ranks(_interrupted_save, str(tmp_path)):
        assert same and step == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
