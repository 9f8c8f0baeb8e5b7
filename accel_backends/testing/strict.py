"""``strict``: a stand-in accelerator on the CPU that keeps a real device's rules where the CPU backend is lenient.

The CPU backend's host copies are the tensor itself and gloo reduces every dtype, so code that reads a host copy
before it landed, or all-reduces float64, passes every CPU test and breaks on its first GPU or NPU run. This
backend runs on the host like the CPU backend (it subclasses it, as any CPU plugin may) but declares, and keeps,
the rules of a device:

* ``deferred_host_copies``: ``to_host(..., non_blocking=True)`` returns a new host buffer holding poison (NaN, or
  an integer dtype's minimum) that receives the data only at ``synchronize()``, as a device-to-host DMA lands only
  when the stream is waited for. Device-side work is stream-ordered after it: ``to_device`` and blocking copies
  land the pending copies first. A move always makes a new tensor, never the tensor itself.
* ``supports_pinned_memory``: True, so callers take the non-blocking path they take on a GPU or NPU.
* ``collective_reduce_dtypes``: HCCL's set by default (no float64); every reduction of a process that joined its
  group (gloo underneath) refuses any other dtype (``strict_group.py``), in a group of one too.
* collectives on the device: where ``metrics_device()`` is not the CPU (a subclass's), every collective refuses a
  host tensor, as NCCL and HCCL do (``strict_group.py``).
* its own memory statistics: every figure a device reports (``reserved`` and ``free`` included) from the process's
  resident memory within ``memory_capacity`` bytes (default: the host's memory).
* host reads: ``host_reads.count_host_reads(backend)`` counts the host's reads of device values in a block (on this
  backend every read, its device being the host), as the report card's ``host-reads`` property does per update.

Select it by name (``ACCEL_BACKEND=strict``, ``accel-backends certify strict``); auto-detection never picks it.
It comes from this package's ``accel_backends`` entry point, or ``ACCEL_BACKENDS_PLUGINS=accel_backends.testing.
strict`` in a checkout that is not installed. A plugin author may subclass it to declare another dtype set (with
its own ``name``).
"""

from __future__ import annotations

import datetime
import threading
from typing import ClassVar

import torch

from ..backends.cpu import CPUBackend
from ..backends.npu import HCCL_REDUCE_DTYPES
from ..base import DEFAULT_DIST_TIMEOUT_S
from ..distributed import DistributedInfo
from ..hookspecs import hookimpl
from ..memory import MemoryStats
from . import strict_group


def poison(tensor: torch.Tensor) -> torch.Tensor:
    """Fill ``tensor`` with what a buffer holds before a copy lands: NaN, an integer's minimum, True."""
    if tensor.dtype == torch.bool:
        return tensor.fill_(True)
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return tensor.fill_(float("nan"))
    return tensor.fill_(torch.iinfo(tensor.dtype).min)


class StrictBackend(CPUBackend):
    """The CPU with a device's rules (see the module docstring); every rule is a class attribute."""

    name = "strict"
    dist_backend = "gloo"  # the dtype check wraps torch.distributed's reductions (strict_group.py)
    priority = -10  # only by name: never chosen by auto-detection
    supports_pinned_memory = True
    collective_reduce_dtypes = HCCL_REDUCE_DTYPES
    deferred_host_copies: ClassVar[bool] = True
    memory_capacity: ClassVar[int | None] = None  # bytes; None: the host's memory

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (host destination, what lands there)
        self._lock = threading.Lock()  # a sampler thread may move tensors while the trainer does

    # -- moves --------------------------------------------------------------------------------------------------

    def to_host(self, tensor: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        host = torch.empty(tensor.shape, dtype=tensor.dtype)
        if non_blocking and self.deferred_host_copies:
            with self._lock:
                self._pending.append((poison(host), tensor.detach().clone()))
            return host
        self.synchronize()  # a blocking copy waits for the work queued before it
        return host.copy_(tensor)

    def to_device(self, tensor: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        self.synchronize()  # the device reads after the copies queued before it (one stream)
        return tensor.clone()

    def synchronize(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for host, data in pending:
            host.copy_(data)

    def pending_host_copies(self) -> int:
        """How many non-blocking host copies have not landed (tests read it)."""
        with self._lock:
            return len(self._pending)

    # -- memory -------------------------------------------------------------------------------------------------

    def memory_stats(self) -> MemoryStats:
        """The CPU's figures as a device reports them: ``reserved`` (no caching allocator: what is allocated), and
        ``total``/``free`` of ``memory_capacity`` when one is declared."""
        host = super().memory_stats()
        total, free = host.total, host.free
        if self.memory_capacity is not None:
            total, free = self.memory_capacity, max(0, self.memory_capacity - host.allocated)
        return MemoryStats(allocated=host.allocated, reserved=host.allocated, peak_allocated=host.peak_allocated,
                           total=total, free=free)

    # -- distributed --------------------------------------------------------------------------------------------

    def init_distributed(self, timeout: float | datetime.timedelta = DEFAULT_DIST_TIMEOUT_S) -> DistributedInfo:
        strict_group.install(self.name, self.collective_reduce_dtypes, self.metrics_device().type)
        return super().init_distributed(timeout)

    def describe(self) -> dict:
        return {**super().describe(), "stand_in_for": "an accelerator (rules: deferred host copies, pinned host "
                "memory, declared reduction dtypes, device memory statistics)",
                "collective_reduce_dtypes": sorted(str(d).removeprefix("torch.")
                                                   for d in self.collective_reduce_dtypes or ())}


@hookimpl
def register_backends(register):
    register(StrictBackend())
