"""The engine at the floor, counted on 2 real ranks (counts and orders, never times).

One spawn per FSDP version (a module fixture; each test asserts one part of its reports) checks: mode switches that
walk no submodule, one all-gather per sharded unit per ``generate`` call, the memory-aware gradient-sync decision,
step-only optimizer onload, non-blocking timed moves and a peak-memory figure that covers a whole update.
"""

import pytest
from distributed import run_ranks
from engine_checks import CopyingCPUBackend

pytestmark = pytest.mark.slow


class SmallDeviceBackend(CopyingCPUBackend):
    """TEST STAND-IN: a copying CPU backend that reports ``free`` bytes of free device memory (None: unknown)."""

    name = "cpu-small"

    def __init__(self, free):
        super().__init__()
        self.free = free

    def memory_stats(self):
        import dataclasses

        return dataclasses.replace(super().memory_stats(), free=self.free)


class PinnedLogBackend(CopyingCPUBackend):
    """TEST STAND-IN: claims pinned host memory and logs moves (with their non_blocking flag), synchronisations,
    peak resets and memory reads, in order."""

    name = "cpu-pinned-log"
    supports_pinned_memory = True

    def __init__(self):
        super().__init__()
        self.log = []

    def to_device(self, tensor, non_blocking=False):
        self.log.append(("to_device", non_blocking))
        return super().to_device(tensor, non_blocking)

    def to_host(self, tensor, non_blocking=False):
        self.log.append(("to_host", non_blocking))
        return super().to_host(tensor, non_blocking)

    def synchronize(self):
        self.log.append(("synchronize",))

    def reset_peak_memory_stats(self):
        self.log.append(("reset_peak",))
        super().reset_peak_memory_stats()

    def memory_stats(self):
        self.log.append(("memory_stats",))
        return super().memory_stats()


def _prompt():
    import torch

    g = torch.Generator().manual_seed(7)
    return {"input_ids": torch.randint(1, 90, (2, 5), generator=g),
            "attention_mask": torch.ones(2, 5, dtype=torch.long)}


def _generate_counts(engine, max_new_tokens):
    from engine_checks import CollectiveCounter

    with engine.eval_mode(), CollectiveCounter() as counter:
        out = engine.generate(**_prompt(), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                              do_sample=False, pad_token_id=0, synced_gpus=True)
    return counter.counts["all_gather"], out


def _check_generate(fsdp_version, lora_rank=0):
    """All-gathers per generate call: the number of units, whatever max_new_tokens; per_layer grows with it."""
    import torch
    from tiny import tiny_qwen2

    from engine import EngineConfig, FSDPEngine

    report = {}
    for gather in ("once", "per_layer"):
        engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=fsdp_version, lora_rank=lora_rank,
                                                     generate_gather=gather))
        _generate_counts(engine, 1)  # warm-up: lazy initialisation
        short, out_short = _generate_counts(engine, 2)
        long, out_long = _generate_counts(engine, 6)
        report[gather] = {"short": short, "long": long, "units": engine.num_sharded_units, "out": out_long}
        assert torch.equal(out_long[:, :out_short.size(1)], out_short)
    assert torch.equal(report["once"]["out"], report["per_layer"]["out"]), "gathering once changes no token"
    for entry in report.values():
        del entry["out"]
    return report


def _check_mode_switch(fsdp_version):
    """Repeated switches call Module.train on nothing; a user's module.eval() is repaired by the next enter."""
    import torch.nn as nn
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    from engine import EngineConfig, FSDPEngine

    engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=fsdp_version))
    batches = make_micro_batches(seed=0, count=1)
    with engine.train_mode():  # the first entry may walk the model once
        engine.forward_backward_batch(batches, token_loss)
        engine.zero_grad()
    calls = []
    original = nn.Module.train

    def counted(self, mode=True):
        calls.append(type(self).__name__)
        return original(self, mode)

    nn.Module.train = counted
    try:
        for _ in range(5):
            with engine.train_mode():
                pass
        repeated = len(calls)
        with engine.train_mode():
            with engine.eval_mode():  # nested: inside all eval, after it all train again
                inner = {m.training for m in engine.module.modules()}
            outer = {m.training for m in engine.module.modules()}
        engine.module.eval()  # behind the engine's back
        with engine.train_mode():
            repaired = {m.training for m in engine.module.modules()}
        engine.module.model.layers[0].eval()  # a submodule only: its root is in train mode
        engine.module.train()  # the user hands the root back: every submodule follows
        with engine.train_mode():
            after_submodule = {m.training for m in engine.module.modules()}
    finally:
        nn.Module.train = original
    return {"repeated_train_calls": repeated, "inner": inner, "outer": outer, "repaired": repaired,
            "after_submodule": after_submodule}


def _check_grad_sync_plan(rank):
    """auto: deferred with room, every micro-batch without (fewer free bytes than the unsharded gradients)."""
    import logging

    from engine_checks import CollectiveCounter
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    from engine import EngineConfig, FSDPEngine

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("engine").addHandler(handler)
    logging.getLogger("engine").setLevel(logging.INFO)
    batches = make_micro_batches(seed=rank, count=2)
    report = {}
    for label, free in {"roomy": 2**40, "tight": 2**18, "unknown": None}.items():
        engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2), backend=SmallDeviceBackend(free))
        with engine.train_mode():
            engine.forward_backward_batch(batches, token_loss)  # warm-up
            engine.zero_grad()
            with CollectiveCounter() as counter:
                engine.forward_backward_batch(batches, token_loss)
            engine.zero_grad()
        report[label] = {"mode": engine.grad_sync_mode, "plan": engine.grad_sync_plan.as_dict(),
                         "reduce_scatter": counter.counts["reduce_scatter"], "units": engine.num_sharded_units}
    explicit = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2, grad_sync="deferred"),
                          backend=SmallDeviceBackend(2**20))
    report["explicit"] = {"mode": explicit.grad_sync_mode, "reason": explicit.grad_sync_plan.reason}
    report["numel"] = sum(p.numel() for p in tiny_qwen2().parameters())
    report["log"] = [(r.levelname, r.getMessage().split(" (")[0]) for r in records]
    return report


def _check_step_onload(rank):
    """optimizer_onload='step': host during forward/backward, one move in and one out per step, same training."""
    from engine_checks import assert_bitwise_equal, local_state
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    from engine import EngineConfig, FSDPEngine, events

    batches = make_micro_batches(seed=rank, count=2)
    moves, residency_in_step_fn = [], []
    original_transfer = events.transfer

    def recorded(engine, what, destination, num_bytes, seconds=None):
        moves.append((what, destination, seconds))
        return original_transfer(engine, what, destination, num_bytes, seconds=seconds)

    engines = {}
    for onload in ("mode", "step"):
        backend = PinnedLogBackend()
        engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2, optimizer_offload=True, param_offload=True,
                                                     optimizer_onload=onload, lr=1e-3), backend=backend)

        def step_fn(module, batch, _engine=engine):
            residency_in_step_fn.append((_engine.config.optimizer_onload, _engine.residency()["optimizer"]))
            return token_loss(module, batch)

        moves.clear()
        backend.log.clear()
        events.transfer = recorded
        try:
            for _ in range(2):
                backend.log.append(("update",))
                with engine.train_mode():
                    engine.forward_backward_batch(batches, step_fn)
                    engine.optimizer_step()
                    backend.log.append(("stepped",))
        finally:
            events.transfer = original_transfer
        engines[onload] = {"engine": engine, "moves": list(moves), "log": list(backend.log),
                           "peak": engine.last_step_metrics["peak_memory_gib"]}
    assert_bitwise_equal(local_state(engines["mode"]["engine"]), local_state(engines["step"]["engine"]))
    return {"residency": residency_in_step_fn,
            **{onload: {k: v for k, v in entry.items() if k != "engine"} for onload, entry in engines.items()}}


def _fsdp2_checks(rank):
    return {"generate": _check_generate(2), "generate_lora": _check_generate(2, lora_rank=4),
            "mode_switch": _check_mode_switch(2), "grad_sync": _check_grad_sync_plan(rank),
            "step_onload": _check_step_onload(rank)}


def _fsdp1_checks(rank):
    return {"generate": _check_generate(1), "generate_lora": _check_generate(1, lora_rank=4),
            "mode_switch": _check_mode_switch(1)}


def _assert_generate(report):
    once, per_layer = report["once"], report["per_layer"]
    assert once["short"] == once["long"] == once["units"], once
    assert per_layer["long"] > per_layer["short"] > once["units"], per_layer


def _assert_mode_switch(report):
    assert report["repeated_train_calls"] == 0, "an already-right mode walks no submodule"
    assert report["inner"] == {False} and report["outer"] == {True}
    assert report["repaired"] == {True} and report["after_submodule"] == {True}


def _assert_update_peak(log):
    """Per update: the peak is reset before its first onload, never again, and read after the step's last move."""
    starts = [i for i, e in enumerate(log) if e == ("update",)]
    assert len(starts) == 2
    for start in starts:
        end = log.index(("stepped",), start)
        update = log[start:end]
        first_onload = next(i for i, e in enumerate(update) if e[0] == "to_device")
        resets = [i for i, e in enumerate(update) if e == ("reset_peak",)]
        assert resets and max(resets) < first_onload, update
        last_copy = max(i for i, e in enumerate(update) if e[0] in ("to_device", "to_host"))
        assert any(e == ("memory_stats",) for e in update[last_copy:]), "the step's peak is read after its moves"


@pytest.fixture(scope="module")
def fsdp2_results():
    """Both ranks' reports of the one FSDP2 spawn; each test below checks one part of them."""
    return run_ranks(_fsdp2_checks)


@pytest.fixture(scope="module")
def fsdp1_results():
    """Both ranks' reports of the one FSDP1 spawn."""
    return run_ranks(_fsdp1_checks)


@pytest.mark.parametrize("fsdp_version", [2, 1])
@pytest.mark.parametrize("part", ["generate", "generate_lora"])
def test_generate_gathers_each_unit_once_per_call(request, fsdp_version, part):
    for result in request.getfixturevalue(f"fsdp{fsdp_version}_results"):
        _assert_generate(result[part])


@pytest.mark.parametrize("fsdp_version", [2, 1])
def test_mode_switches_walk_no_submodule(request, fsdp_version):
    for result in request.getfixturevalue(f"fsdp{fsdp_version}_results"):
        _assert_mode_switch(result["mode_switch"])


def test_fsdp2_gradient_sync_decision_fits_the_free_memory(fsdp2_results):
    for rank, result in enumerate(fsdp2_results):
        sync = result["grad_sync"]
        units = sync["roomy"]["units"]
        assert sync["roomy"]["mode"] == "deferred" and sync["roomy"]["reduce_scatter"] == units
        assert sync["tight"]["mode"] == "every_micro_batch" and sync["tight"]["reduce_scatter"] == 2 * units
        plan = sync["tight"]["plan"]
        numel = sync["numel"]  # fp32, 2 ranks: full fp32 gradients less the half-size shard; AdamW: 2 x the shard
        assert plan["free_bytes"] == 2**18
        assert plan["needed_bytes"] == numel * 4 - numel * 4 // 2 and plan["reserved_bytes"] == 2 * numel * 4 // 2
        assert "do not fit" in sync["tight"]["plan"]["reason"]
        assert sync["unknown"]["mode"] == "every_micro_batch" and "no free memory" in sync["unknown"]["plan"]["reason"]
        assert sync["explicit"] == {"mode": "deferred", "reason": "set explicitly in EngineConfig.grad_sync"}
        logged = [("INFO", "gradient sync: deferred"), ("WARNING", "gradient sync: every_micro_batch"),
                  ("WARNING", "gradient sync: every_micro_batch"), ("INFO", "gradient sync: deferred")]
        assert sync["log"] == (logged if rank == 0 else []), "once per engine, on rank 0 only"


def test_fsdp2_optimizer_onload_is_step_only_with_timed_non_blocking_moves(fsdp2_results):
    for result in fsdp2_results:
        onload = result["step_onload"]
        assert {r for o, r in onload["residency"] if o == "step"} == {"cpu"}
        assert {r for o, r in onload["residency"] if o == "mode"} == {"device"}
        step_moves = [(w, d) for w, d, _ in onload["step"]["moves"]]
        per_update = [("params", "device"), ("optimizer", "device"), ("optimizer", "cpu"), ("params", "cpu")]
        assert step_moves == per_update * 2, step_moves
        mode_moves = [(w, d) for w, d, _ in onload["mode"]["moves"]]
        assert mode_moves == [("params", "device"), ("optimizer", "device"), ("params", "cpu"),
                              ("optimizer", "cpu")] * 2, mode_moves
        for entry in (onload["step"], onload["mode"]):
            assert all(isinstance(s, float) and s >= 0 for _, _, s in entry["moves"]), "every move is timed"
            log = entry["log"]
            copies = [e for e in log if e[0] in ("to_device", "to_host")]
            assert copies and all(e[1] is True for e in copies), "pinned memory: every copy is non-blocking"
            assert log.count(("synchronize",)) == len(entry["moves"]), "one synchronisation per move"
            _assert_update_peak(log)
            assert entry["peak"] > 0
