"""The rules of the backend contract, each a function that raises when the backend breaks it.

A check raises ``RuleSkipped`` when the rule does not apply here (say why) and anything else (an
``AssertionError`` with a message naming what broke) when the backend breaks the rule. In-process rules run in
the caller's process; multi-process rules run in every rank of a job (``accel_backends.spawn``). These are the
device layer's own rules; layers above add theirs through the ``register_conformance_rules`` hook (``kit.py``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from ..base import DeviceBackend
from ..errors import BackendUnavailableError
from ..memory import MemoryStats
from ..registry import safe_reason

MEMORY_PROBE_BYTES = 64 * 2**20  # large enough to stand out of allocator and host-RSS noise
GROUP_TIMEOUT_S = 60.0  # a rank that fails while another waits in a collective is reported, not waited for


class RuleSkipped(Exception):
    """The rule does not apply to this backend here; the message says why."""


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    summary: str  # the contract sentence this rule checks
    check: Callable[..., str]  # returns a short note on success
    multi_process: bool = False


def require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def require_available(backend: DeviceBackend) -> None:
    reason = safe_reason(backend)  # a probe that raises breaks the availability rule, not every rule
    if reason is not None:
        raise RuleSkipped(f"the backend is not available here: {reason}")


# -- in-process rules -------------------------------------------------------------------------------------------


def check_attributes(backend: DeviceBackend) -> str:
    require(isinstance(backend, DeviceBackend), f"{backend!r} is not a DeviceBackend")
    for attribute in ("name", "device_type", "dist_backend"):
        value = getattr(backend, attribute, None)
        require(isinstance(value, str) and value.strip() == value and value,
                f"`{attribute}` must be a non-empty string without spaces around it, got {value!r}")
    require(backend.name == backend.name.lower(), f"`name` must be lower case (users type it), got {backend.name!r}")
    require(isinstance(backend.priority, int) and not isinstance(backend.priority, bool),
            f"`priority` must be an int, got {backend.priority!r}")
    require(backend.visible_devices_env is None or isinstance(backend.visible_devices_env, str),
            f"`visible_devices_env` must be None or a variable name, got {backend.visible_devices_env!r}")
    require(isinstance(backend.supports_pinned_memory, bool),
            f"`supports_pinned_memory` must be a bool, got {backend.supports_pinned_memory!r}")
    require(isinstance(backend.computes_on_host_threads, bool),
            f"`computes_on_host_threads` must be a bool, got {backend.computes_on_host_threads!r}")
    require(isinstance(backend.preferred_param_dtype, torch.dtype) and backend.preferred_param_dtype.is_floating_point,
            f"`preferred_param_dtype` must be a floating torch.dtype, got {backend.preferred_param_dtype!r}")
    try:
        torch.device(backend.device_type)
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"`device_type` {backend.device_type!r} is not a torch device type: {exc}") from None
    description = backend.describe()
    require(isinstance(description, dict), f"describe() must return a dict, got {type(description).__name__}")
    return (f"name {backend.name!r}, device type {backend.device_type!r}, dist backend {backend.dist_backend!r}, "
            f"priority {backend.priority}")


def check_availability(backend: DeviceBackend) -> str:
    try:
        reason = backend.unavailable_reason()
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"unavailable_reason() must never raise; it raised {type(exc).__name__}: {exc}") from None
    require(reason is None or (isinstance(reason, str) and reason.strip()),
            f"unavailable_reason() must return None or a sentence, got {reason!r}")
    require(backend.is_available() == (reason is None),
            f"is_available() is {backend.is_available()} but unavailable_reason() is {reason!r}")
    require(backend.unavailable_reason() == reason, "unavailable_reason() changed between two calls")
    if reason is None:
        return "available"
    try:
        backend.require_available()
    except BackendUnavailableError as exc:
        require(reason in str(exc), f"require_available() must quote the reason {reason!r}, said {exc}")
    else:
        raise AssertionError("require_available() did not raise although the backend is unavailable")
    return f"unavailable, with the reason: {reason}"


def check_devices(backend: DeviceBackend) -> str:
    require_available(backend)
    count = backend.device_count()
    require(isinstance(count, int) and count >= 1, f"device_count() must be an int >= 1 when available, got {count!r}")
    device = backend.device()
    require(isinstance(device, torch.device) and device.type == backend.device_type,
            f"device() must be a torch.device of type {backend.device_type!r}, got {device!r}")
    backend.set_device(backend.current_index())
    backend.synchronize()
    for method in ("metrics_device", "fsdp_device_id"):
        value = getattr(backend, method)()
        require(isinstance(value, torch.device), f"{method}() must return a torch.device, got {value!r}")
    group_device = backend.process_group_device_id()
    require(group_device is None or isinstance(group_device, torch.device),
            f"process_group_device_id() must return None or a torch.device, got {group_device!r}")
    torch.ones(4, device=device).sum().item()  # a kernel really runs there
    return f"{count} device(s), current {device}"


def _stats(backend: DeviceBackend) -> MemoryStats:
    stats = backend.memory_stats()
    require(isinstance(stats, MemoryStats), f"memory_stats() must return a MemoryStats, got {type(stats).__name__}")
    for field, value in stats.as_dict().items():
        require(value is None or (isinstance(value, int) and value >= 0),
                f"memory_stats().{field} must be None or a non-negative int of bytes, got {value!r}")
    require(stats.allocated is not None and stats.peak_allocated is not None,
            "memory_stats() must report `allocated` and `peak_allocated` (the engine reports peak memory per step)")
    return stats


def check_memory(backend: DeviceBackend) -> str:
    require_available(backend)
    size = MEMORY_PROBE_BYTES
    backend.synchronize()
    backend.reset_peak_memory_stats()
    before = _stats(backend)
    require(before.total is None or before.free is None or before.free <= before.total,
            f"memory_stats(): free ({before.free}) exceeds total ({before.total})")
    block = torch.empty(size, dtype=torch.uint8, device=backend.device()).fill_(1)  # touched: really resident
    backend.synchronize()
    during = _stats(backend)
    require(during.allocated - before.allocated >= size // 2,
            f"allocating {size >> 20} MiB moved `allocated` by only {(during.allocated - before.allocated) >> 20} MiB "
            f"({before.allocated} -> {during.allocated} bytes)")
    require(during.peak_allocated >= during.allocated,
            f"`peak_allocated` ({during.peak_allocated}) is below `allocated` ({during.allocated})")
    del block
    backend.synchronize()
    backend.empty_cache()
    backend.reset_peak_memory_stats()
    after = _stats(backend)
    require(after.peak_allocated <= during.peak_allocated - size // 2,
            f"reset_peak_memory_stats() did not reset the peak: {during.peak_allocated} bytes with a {size >> 20} MiB "
            f"block alive, still {after.peak_allocated} after freeing it and resetting")
    return (f"+{(during.allocated - before.allocated) >> 20} MiB allocated for a {size >> 20} MiB block; peak "
            f"{during.peak_allocated >> 20} MiB -> {after.peak_allocated >> 20} MiB after reset")


def sample_tensors() -> dict[str, torch.Tensor]:
    """Tensors whose bytes a move must keep: special floats, extremes, odd shapes, a non-contiguous view."""
    g = torch.Generator().manual_seed(7)
    floats = torch.randn(257, generator=g)
    floats[:4] = torch.tensor([math.nan, math.inf, -math.inf, -0.0])
    return {
        "float32": floats,
        "bfloat16": torch.randn(64, 3, generator=g).to(torch.bfloat16),
        "float16": torch.randn(33, generator=g).to(torch.float16),
        "int64": torch.tensor([torch.iinfo(torch.int64).min, -1, 0, 1, torch.iinfo(torch.int64).max]),
        "uint8": torch.arange(256, dtype=torch.uint8),
        "bool": torch.rand(19, generator=g) > 0.5,
        "non-contiguous": torch.randn(8, 6, generator=g).t(),
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 5),
    }


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the tensor's bytes on the host (NaN-safe, unlike ``torch.equal`` on values)."""
    return tensor.detach().to("cpu", copy=True).contiguous().reshape(-1).view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw_bytes(a), raw_bytes(b))


def check_moves(backend: DeviceBackend) -> str:
    require_available(backend)
    pinned = backend.supports_pinned_memory
    for label, original in sample_tensors().items():
        source = original.clone()
        on_device = backend.to_device(source)
        require(on_device.device.type == backend.device_type,
                f"to_device() of the {label} tensor landed on {on_device.device}, not on {backend.device_type}")
        for non_blocking in (False, True):
            back = backend.to_host(on_device, non_blocking=non_blocking)
            if non_blocking:
                backend.synchronize()
            require(back.device.type == "cpu", f"to_host() of the {label} tensor returned a {back.device} tensor")
            require(_same(back, original),
                    f"the {label} tensor changed on its way to the device and back (non_blocking={non_blocking}): "
                    f"dtype {original.dtype} -> {back.dtype}, shape {tuple(original.shape)} -> {tuple(back.shape)}"
                    f", or its bytes differ")
            if pinned and backend.device_type != "cpu" and back.numel():
                require(back.is_pinned(), f"supports_pinned_memory is True but to_host() of the {label} tensor "
                        "returned pageable memory")
            again = backend.to_device(back, non_blocking=non_blocking)
            backend.synchronize()
            require(_same(again, original), f"the {label} tensor changed on its second way to the device")
        require(_same(source, original), f"moving the {label} tensor modified the source tensor")
    pinned_note = " (pinned host memory)" if pinned else ""
    return f"{len(sample_tensors())} tensors bitwise equal after round trips{pinned_note}"


def _draws(backend: DeviceBackend) -> list[torch.Tensor]:
    draws = [torch.rand(16)]
    if backend.device_type != "cpu":
        draws.append(torch.rand(16, device=backend.device()).cpu())
    return draws


def check_rng(backend: DeviceBackend) -> str:
    require_available(backend)
    backend.manual_seed(1234)
    state = backend.rng_state()
    require(isinstance(state, dict) and all(torch.is_tensor(v) for v in state.values()),
            f"rng_state() must return a dict of tensors, got {type(state).__name__}")
    first = _draws(backend)
    backend.set_rng_state(state)
    replay = _draws(backend)
    require(all(torch.equal(a, b) for a, b in zip(first, replay, strict=True)),
            "set_rng_state(rng_state()) did not restore the generators: the draws after it differ")
    backend.manual_seed(1234)
    reseeded = _draws(backend)
    require(all(torch.equal(a, b) for a, b in zip(first, reseeded, strict=True)),
            "manual_seed() with the same seed did not repeat the same draws")
    backend.manual_seed(4321)
    require(not torch.equal(_draws(backend)[-1], first[-1]), "manual_seed() with another seed repeated the draws")
    return f"generators {sorted(state)} restored and reseeded"


# -- multi-process rules (run in every rank) -------------------------------------------------------------------


def check_distributed(backend: DeviceBackend, nproc: int) -> str:
    """Join a job as torchrun started it, all-reduce on the metrics device and the device, call again."""
    import os

    import torch.distributed as dist

    info = backend.init_distributed(timeout=GROUP_TIMEOUT_S)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    require((info.rank, info.world_size) == (rank, world),
            f"init_distributed() returned rank {info.rank} of {info.world_size}; the launcher said {rank} of {world}")
    require(dist.is_initialized() and dist.get_world_size() == world,
            f"init_distributed() did not join the {world}-process group (world size "
            f"{dist.get_world_size() if dist.is_initialized() else 'not initialised'})")
    require(str(dist.get_backend()).lower() == backend.dist_backend.lower(),
            f"the process group runs {dist.get_backend()!r}, but dist_backend is {backend.dist_backend!r}")
    expected = world * (world + 1) / 2
    metric = torch.tensor([rank + 1.0], device=backend.metrics_device())
    dist.all_reduce(metric)
    require(metric.item() == expected, f"all-reduce on metrics_device() gave {metric.item()}, expected {expected}")
    block = torch.full((1024,), rank + 1.0, device=backend.device())
    dist.all_reduce(block)
    require(bool((block == expected).all()), "all-reduce of a tensor on device() gave wrong values")
    again = backend.init_distributed(timeout=GROUP_TIMEOUT_S)
    require((again.rank, again.world_size) == (rank, world), "a second init_distributed() call is not idempotent")
    return (f"{world}-process '{dist.get_backend()}' group, all-reduce right on {backend.metrics_device()} and "
            f"{backend.device()}")


def check_all_to_all(backend: DeviceBackend, nproc: int) -> str:
    """A group made by ``new_group`` of every rank; ``all_to_all`` sends chunk ``i`` to rank ``i`` (sequence
    parallelism's exchange); ``sequence_parallel_facts()`` is well formed."""
    import torch.distributed as dist

    from ..base import SequenceParallelFacts

    facts = backend.sequence_parallel_facts()
    require(isinstance(facts, SequenceParallelFacts), f"sequence_parallel_facts() returned {facts!r}")
    require(isinstance(facts.head_multiple, int) and facts.head_multiple >= 1,
            f"sequence_parallel_facts().head_multiple must be an int >= 1, got {facts.head_multiple!r}")
    if facts.unsupported:
        raise RuleSkipped(f"the backend says sequence parallelism cannot run: {facts.unsupported}")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = backend.new_group(list(range(world)))
    # Rank r sends 100 * r + i to rank i, three values each: rank r must receive 100 * i + r from every rank i.
    send = (100.0 * rank + torch.arange(world, dtype=torch.float32)).repeat_interleave(3).to(backend.device())
    received = torch.empty_like(send)
    backend.all_to_all(received, send, group)
    want = (100.0 * torch.arange(world, dtype=torch.float32) + rank).repeat_interleave(3)
    require(torch.equal(received.cpu(), want), f"all_to_all() gave {received.cpu().tolist()}, expected {want.tolist()}")
    return f"all_to_all over a {world}-rank group from new_group() right on {backend.device()}"


DEVICE_RULES: tuple[Rule, ...] = (
    Rule("attributes", "class attributes name, device_type, dist_backend, priority... are well formed",
         check_attributes),
    Rule("availability", "unavailable_reason() is None or a sentence, never raises, agrees with is_available()",
         check_availability),
    Rule("devices", "device_count(), device(), set_device(), synchronize() and the device ids work", check_devices),
    Rule("memory", "memory_stats() moves when memory is allocated and its peak resets", check_memory),
    Rule("moves", "to_device()/to_host() round-trip values bitwise (pinned host memory where claimed)", check_moves),
    Rule("rng", "rng_state()/set_rng_state() and manual_seed() reproduce the draws", check_rng),
    Rule("distributed", "init_distributed() joins a multi-process group whose all-reduce is right", check_distributed,
         multi_process=True),
    Rule("all-to-all", "new_group() and all_to_all() exchange chunks between ranks (sequence parallelism)",
         check_all_to_all, multi_process=True),
)
