"""The engine's conformance rules: one small training step of the real engine on the backend under test, and the
packing probe with the backend's attention implementation.

The kit in ``accel_backends.testing`` checks the device contract and knows nothing of engines; this module adds
``engine-fsdp2``, ``engine-fsdp1`` and ``engine-packing`` to it through the ``register_conformance_rules`` hook
(the project's ``accel_backends.conformance`` entry point, or ``ACCEL_BACKENDS_PLUGINS=engine.conformance`` in a
checkout that is not installed). Each runs in every rank of the kit's job; the engine's observer events are
recorded to check that every mode enter event is followed by its exit event and that the moves are reported.
"""

from __future__ import annotations

import torch

from accel_backends import DeviceBackend, hookimpl, register_plugin, unregister_plugin
from accel_backends.testing import Rule, RuleSkipped, raw_bytes, require

from .certify import register_certify_properties  # noqa: F401 - the report card's hook, same entry point
from .tiny_model import UNEVEN

VOCAB = UNEVEN["vocab_size"]


def tiny_causal_lm():
    """A randomly initialised two-layer Qwen2 (nothing downloaded), the same on every rank, with dims no world size
    of 2 or 3 divides: FSDP2 pads the last rank's shards, which the offload round trip must survive."""
    from .tiny_model import tiny_qwen2

    return tiny_qwen2(seed=0, max_positions=32, **UNEVEN)


def token_loss(module, batch):
    """Mean next-token cross-entropy; weight = number of target tokens."""
    device = next(module.parameters()).device
    ids = batch.to(device)
    logits = module(input_ids=ids).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    return loss, ids[:, 1:].numel()


class EventRecorder:
    """Observer plugin: the engine's events in the order they fired."""

    def __init__(self):
        self.events: list[tuple] = []

    @hookimpl
    def on_mode_switch(self, engine, mode, entering):
        self.events.append(("mode", mode, entering))

    @hookimpl
    def on_transfer(self, engine, what, destination, num_bytes, seconds):
        self.events.append(("transfer", what, destination, num_bytes))


def _local_state(engine) -> dict[str, torch.Tensor]:
    from .fsdp.offload import local

    state = {f"param:{n}": raw_bytes(local(p)) for n, p in engine.module.named_parameters()}
    for i, param_state in enumerate(engine.optimizer.state.values()):
        for key, value in param_state.items():
            if torch.is_tensor(value):
                state[f"optimizer:{i}:{key}"] = raw_bytes(local(value))
    return state


def check_mode_events(events: list[tuple]) -> None:
    """Every enter event is followed by the exit event of the same mode, innermost first."""
    open_modes = []
    for event in events:
        if event[0] != "mode":
            continue
        _, mode, entering = event
        if entering:
            open_modes.append(mode)
        else:
            require(open_modes and open_modes[-1] == mode, f"on_mode_switch: exit of {mode!r} without its enter event")
            open_modes.pop()
    require(not open_modes, f"on_mode_switch: enter of {open_modes} never followed by an exit event")


def run_engine_smoke(backend: DeviceBackend, fsdp_version: int) -> str:
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise RuleSkipped(f"the engine rules need transformers: {exc}") from None
    from . import EngineConfig, FSDPEngine

    config = EngineConfig(fsdp_version=fsdp_version, grad_sync="deferred", lr=1e-2, max_grad_norm=1.0)
    engine = FSDPEngine(tiny_causal_lm, config, backend=backend)
    rank = engine.rank
    generator = torch.Generator().manual_seed(100 + rank)
    micro_batches = [torch.randint(0, VOCAB, (2, 9), generator=generator),
                     torch.randint(0, VOCAB, (1, 12), generator=generator)]
    recorder = EventRecorder()
    register_plugin(recorder)
    try:
        before = _local_state(engine)
        with engine.train_mode():
            metrics = engine.forward_backward_batch(micro_batches, token_loss)
            grad_norm = engine.optimizer_step()
        require(engine.grad_sync_mode == "deferred", f"the engine synced with {engine.grad_sync_mode!r}, not deferred")
        require(torch.isfinite(torch.tensor(metrics["loss"])) and metrics["micro_batches"] == 2,
                f"forward_backward_batch gave {metrics}")
        require(grad_norm > 0 and torch.isfinite(torch.tensor(grad_norm)), f"gradient norm {grad_norm}")
        stepped = _local_state(engine)
        changed = [k for k in before if k.startswith("param:") and not torch.equal(before[k], stepped[k])]
        require(changed, "one optimizer step changed no parameter on this rank")

        engine.to("cpu")
        require(engine.residency() == {"params": "cpu", "optimizer": "cpu"}, f"residency {engine.residency()}")
        engine.to("device")
        after = _local_state(engine)
        lost = [k for k in stepped if not torch.equal(stepped[k], after[k])]
        require(not lost, f"the offload round trip changed {len(lost)} tensors, e.g. {lost[:3]}")
        with engine.eval_mode():
            engine.forward_backward_batch(micro_batches, token_loss, forward_only=True)
    finally:
        unregister_plugin(recorder)
    check_mode_events(recorder.events)
    moves = [(what, where) for kind, what, where, *_ in recorder.events if kind == "transfer"]
    for what in ("params", "optimizer"):
        require(moves.count((what, "cpu")) == 1 and moves.count((what, "device")) == 1,
                f"on_transfer: expected one move of {what} each way for the offload round trip, saw {moves}")
    require(all(e[3] > 0 for e in recorder.events if e[0] == "transfer"), "on_transfer reported a move of 0 bytes")
    return (f"loss {metrics['loss']:.3f}, grad norm {grad_norm:.3f}, {len(changed)} parameter shards stepped, "
            f"offload round trip bitwise")


def _engine_rule(version: int) -> Rule:
    def check(backend: DeviceBackend, nproc: int) -> str:
        return run_engine_smoke(backend, version)

    return Rule(f"engine-fsdp{version}", f"FSDP{version} engine: two micro-batches, deferred sync, one optimizer "
                "step, one offload round trip", check, multi_process=True)


def run_packing_probe(backend: DeviceBackend, nproc: int) -> str:
    """The attention implementation the backend prefers keeps packed sequences apart on a sharded tiny model."""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise RuleSkipped(f"the engine rules need transformers: {exc}") from None
    from . import EngineConfig, FSDPEngine

    engine = FSDPEngine(tiny_causal_lm, EngineConfig(fsdp_version=2), backend=backend)
    supported = engine.packed_input_supported()
    probe = engine.packed_input_probe
    require(supported, f"attention implementation {engine.attn_implementation!r} (the backend's choice: "
                       f"{backend.attention_implementation(packed=True)!r}) cannot take packed input: "
                       f"{probe.describe()}")
    return f"attention {engine.attn_implementation!r}: {probe.describe()}"


@hookimpl
def register_conformance_rules(register):
    register(_engine_rule(2))
    register(_engine_rule(1))
    register(Rule("engine-packing", "the backend's attention implementation keeps the sequences of a packed row "
                  "apart (positions restarting at 0, no mask), as transformers' sdpa, eager and flash-attention do",
                  run_packing_probe, multi_process=True))
