"""Faults: a micro-batch that raises, a NaN loss, a save that dies part-way, and resume parity."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow


class BadBatch(Exception):
    pass


def _raising_step(module, batch):
    from tiny import token_loss
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

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
    from engine_checks import assert_grads_close, full_grads
    from tiny import make_micro_batches, reference_grads, tiny_qwen2, token_loss
    from torch.distributed.tensor import DTensor

    from engine import EngineConfig, FSDPEngine
    from engine.fsdp import private_state as compat
    from engine.fsdp.grad_sync import gradient_sync_enabled

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

    from engine_checks import assert_bitwise_equal, local_state
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    import accel_backends
    from engine import EngineConfig, FSDPEngine

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
    for _ in range(steps):
        with engine.train_mode():
            batches = make_micro_batches(seed=100 * engine.global_step + rank, count=2)
            losses.append(engine.forward_backward_batch(batches, token_loss)["loss"])
            engine.optimizer_step()
    return losses


def _resume(rank, root, fsdp_version, lora):
    import torch
    from tiny import tiny_qwen2

    from engine import EngineConfig, FSDPEngine

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
    from engine_checks import full_params
    from tiny import tiny_qwen2

    import engine.checkpoint.store as checkpoint
    from engine import EngineConfig, FSDPEngine

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


# -- faults on one rank only, checkpoints that are not complete, uneven shards, elastic resume ---------------------


def uneven_qwen2():
    """Dimensions that do not divide over 2 ranks (vocabulary 97, MLP 75; hidden 48): FSDP pads their shards."""
    from engine.tiny_model import tiny_qwen2

    return tiny_qwen2(seed=4321, vocab_size=97, hidden_size=48, intermediate_size=75, max_positions=64)


def _with_metric(extra):
    def step(module, batch):
        from tiny import token_loss

        loss, count = token_loss(module, batch)
        return loss, count, {"shared": 1.0, **extra}

    return step


def _nan_on_rank1(module, batch):
    import torch.distributed as dist
    from tiny import token_loss

    loss, count = token_loss(module, batch)
    return (loss * float("nan") if dist.get_rank() == 1 else loss), count


def _one_rank_faults(rank, root):
    """Metric keys on one rank only, NaN on one rank only, a truncated shard, a failed metadata write."""
    import math
    import warnings

    import torch.distributed as dist
    from engine_checks import assert_bitwise_equal, full_params, local_state
    from tiny import make_micro_batches, tiny_qwen2

    import engine.checkpoint as checkpoint
    import engine.checkpoint.store as store
    from engine import EngineConfig, FSDPEngine
    from engine.runtime import MetricKeysMismatch

    engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2, lr=1e-2))
    batches = make_micro_batches(seed=rank, count=2)
    with engine.train_mode():
        # A metric only rank 1 logs: both ranks get the same error naming rank and key, nothing hangs or mixes.
        with pytest.raises(MetricKeysMismatch, match="rank 0 lacks 'only_on_rank1'"):
            engine.forward_backward_batch(batches, _with_metric({"only_on_rank1": 2.0} if rank == 1 else {}))
        assert all(p.grad is None for p in engine.module.parameters()), "the failed mini-batch's gradients go"
        metrics = engine.forward_backward_batch(batches, _with_metric({}))  # the engine stays usable
        assert metrics["shared"] == pytest.approx(1.0)
        engine.optimizer_step()
        # NaN on rank 1 only: the global norm is NaN on every rank, so every rank skips the same step.
        before = local_state(engine)
        metrics = engine.forward_backward_batch(batches, _nan_on_rank1)
        norm = engine.optimizer_step()
        assert math.isnan(metrics["loss"]) and not math.isfinite(norm)
        assert engine.last_step_metrics["skipped"] and engine.skipped_steps == 1
        assert_bitwise_equal(before, local_state(engine))

    checkpoints = f"{root}/checkpoints"
    engine.save_checkpoint(f"{checkpoints}/step_000001")
    step1 = full_params(engine)
    _train(engine, 1, rank)
    # Rank 0 cannot write the metadata (disk full) after every rank wrote its shards: no checkpoint, no hang.
    write_meta = store._write_meta
    store._write_meta = lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device"))
    try:
        with pytest.raises(RuntimeError, match="previous checkpoint there is untouched"):
            engine.save_checkpoint(f"{checkpoints}/step_000002")
    finally:
        store._write_meta = write_meta
    assert checkpoint.latest_complete(checkpoints).name == "step_000001", "an unconfirmed .partial never counts"
    engine.save_checkpoint(f"{checkpoints}/step_000002")
    _train(engine, 1, rank)
    engine.save_checkpoint(f"{checkpoints}/step_000003")
    engine.save_checkpoint(f"{checkpoints}/step_000004")
    dist.barrier()
    if rank == 0:  # a crash cut rank 1's shard short
        shard = f"{checkpoints}/step_000002/__1_0.distcp"
        with open(shard, "r+b") as f:
            f.truncate(100)
        # Damaged at the same size (the recorded sizes match): a shard, which torch's collective load fails with a
        # CheckpointException (a BaseException), and rank 1's extra state, which only rank 1 reads.
        for damaged in ("step_000003/__0_0.distcp", "step_000004/extra_rank1.pt"):
            path = f"{checkpoints}/{damaged}"
            with open(path, "r+b") as f:
                size = len(f.read())
                f.seek(0)
                f.write(b"\xff" * size)
    dist.barrier()
    fresh = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2, lr=1e-2))
    with pytest.raises(checkpoint.CorruptCheckpoint, match=r"__1_0\.distcp is truncated"):
        fresh.load_checkpoint(f"{checkpoints}/step_000002")
    own = "extra_rank1.pt is damaged" if rank == 1 else "step_000004 could not be read on another rank"
    with pytest.raises(checkpoint.CorruptCheckpoint, match="resume_fallback=true would load the previous one") as no:
        checkpoint.load_latest(fresh, checkpoints, fallback=False)
    assert own in str(no.value), no.value  # every rank refuses the same checkpoint, each saying why it knows
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = checkpoint.load_latest(fresh, checkpoints, fallback=True)
    assert loaded.name == "step_000001"  # on both ranks: the newest one that every rank can load
    fell_back = [str(w.message) for w in caught if "falling back to the previous complete checkpoint" in str(w.message)]
    assert len(fell_back) == 3, fell_back  # from step 4 (rank 1's extra state), 3 (a shard) and 2 (truncated)
    assert own in fell_back[0] and "step_000003 could not be read" in fell_back[1], fell_back
    assert r"__1_0.distcp is truncated" in fell_back[2], fell_back
    after = full_params(fresh)
    return all(bool((after[k] == step1[k]).all()) for k in step1)


def test_faults_on_one_rank_and_damaged_checkpoints(tmp_path):
    assert run_ranks(_one_rank_faults, str(tmp_path)) == [True, True]


def test_latest_complete_considers_only_complete_step_directories(tmp_path):
    from engine.checkpoint import META_FILE, complete_checkpoints, latest_complete, step_of

    def make(name, complete=True):
        (tmp_path / name).mkdir()
        if complete:
            (tmp_path / name / META_FILE).write_text("{}")

    assert latest_complete(tmp_path) is None
    make("step_000001")
    make("step_000002")
    make("step_000003", complete=False)  # crashed before the metadata: incomplete
    make("step_000004.partial")  # an unconfirmed save (even with metadata, as older versions wrote it)
    make("step_000002.old")  # step_000002 itself is complete: the .old is a leftover
    make("step_000005.old")  # a save that died between its two renames: the .old is all there is
    make("step_abc")
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_000005.old", "step_000002", "step_000001"]
    assert step_of(latest_complete(tmp_path)) == 5


def _uneven_parity(rank):
    """Gradients match a single process for FSDP1/FSDP2 with padded shards; an offload round trip changes nothing."""
    from tiny import make_micro_batches, reference_grads

    per_rank = [make_micro_batches(seed=30 + r, count=3) for r in range(2)]
    reference = reference_grads(per_rank, model=uneven_qwen2())
    return {version: _uneven_versus_reference(rank, version, per_rank, reference) for version in (1, 2)}


def _uneven_versus_reference(rank, fsdp_version, per_rank, reference):
    from engine_checks import CopyingCPUBackend, assert_bitwise_equal, assert_grads_close, full_grads, local_state
    from tiny import token_loss

    from engine import EngineConfig, FSDPEngine

    states = []
    for offload in (False, True):
        config = EngineConfig(fsdp_version=fsdp_version, lr=1e-2, param_offload=offload, optimizer_offload=offload)
        engine = FSDPEngine(uneven_qwen2, config, backend=CopyingCPUBackend() if offload else None)
        for step in range(2):
            with engine.train_mode():
                engine.forward_backward_batch(per_rank[rank], token_loss)
                if step == 0:
                    worst = assert_grads_close(full_grads(engine), reference)
                engine.optimizer_step()
        if offload:
            assert engine.residency() == {"params": "cpu", "optimizer": "cpu"}
            assert engine.backend.moves["to_device"] and engine.backend.moves["to_host"]
        engine.to("device")
        states.append(local_state(engine))
    assert_bitwise_equal(*states)
    return worst


def test_uneven_shards_match_a_single_process_and_survive_offload():
    for worst in run_ranks(_uneven_parity):
        print("uneven shards, largest gradient difference to one process:", worst)


# Elastic resume: a checkpoint written by N ranks with one FSDP version loads into M ranks with the other. The global
# batch is the same (the engine weights micro-batches over all ranks), so one more step must give the same weights.


def _elastic_step(engine, rank, world_size):
    from engine_checks import full_params
    from tiny import make_micro_batches, token_loss

    batches = [make_micro_batches(seed=70 + r, count=1)[0] for r in range(2)]
    mine = batches if world_size == 1 else [batches[rank]]
    with engine.train_mode():
        engine.forward_backward_batch(mine, token_loss)
        engine.optimizer_step()
    return full_params(engine)


def _elastic(rank, root, save_as, load):
    """``save_as``: (fsdp_version, name) to train one step, save, step again; ``load``: (fsdp_version, name, saved
    by how many ranks) to load and take that same second step. Returns the weights after each second step."""
    import os
    import warnings

    from tiny import make_micro_batches, token_loss

    from engine import EngineConfig, FSDPEngine

    world_size = int(os.environ["WORLD_SIZE"])
    out = {}
    if save_as:
        version, name = save_as
        engine = FSDPEngine(uneven_qwen2, EngineConfig(fsdp_version=version, lr=1e-2))
        batches = [make_micro_batches(seed=60 + r, count=1)[0] for r in range(2)]
        with engine.train_mode():
            engine.forward_backward_batch(batches if world_size == 1 else [batches[rank]], token_loss)
            engine.optimizer_step()
        engine.save_checkpoint(f"{root}/{name}")
        out["saved"] = _elastic_step(engine, rank, world_size)
    if load:
        version, name, saved_by = load
        engine = FSDPEngine(uneven_qwen2, EngineConfig(fsdp_version=version, lr=1e-2))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.load_checkpoint(f"{root}/{name}")
        assert engine.global_step == 1
        if saved_by != world_size:
            assert any("resharded" in str(w.message) for w in caught)
        out["loaded"] = _elastic_step(engine, rank, world_size)
    return out


def test_elastic_resume_two_ranks_to_one_and_one_to_two_across_fsdp_versions(tmp_path):
    import torch

    def same(got, want):
        assert set(got) == set(want)
        for key in want:
            assert torch.allclose(got[key], want[key], rtol=1e-5, atol=1e-6), key

    # 1 rank, FSDP1 -> 2 ranks, FSDP2 (which also saves) -> 1 rank, FSDP1.
    [one] = run_ranks(_elastic, str(tmp_path), (1, "by_one_fsdp1"), None, world_size=1)
    two = run_ranks(_elastic, str(tmp_path), (2, "by_two_fsdp2"), (2, "by_one_fsdp1", 1))
    [back] = run_ranks(_elastic, str(tmp_path), None, (1, "by_two_fsdp2", 2), world_size=1)
    same(two[0]["loaded"], one["saved"])
    same(back["loaded"], two[0]["saved"])
