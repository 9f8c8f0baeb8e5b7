"""Counting the host's reads of device values: each one stalls the host until the device's queue reaches it.

On a GPU or NPU, ``loss.item()``, ``if mask.any():``, ``tensor.tolist()`` or a boolean-mask index (its output size
is a device value) makes the host wait for every kernel queued before, so the device idles while the host catches
up. A training step should read a constant handful of figures, once, after its work is queued: not some per
micro-batch or per layer. ``count_host_reads(backend)`` counts them in a block of code, with the place of each
(``HostReads.where``), through a ``TorchFunctionMode``:

* on a device (``backend.device_type`` other than the CPU), the reads of tensors on that device type;
* on a backend that computes on the host (the CPU, the strict stand-in), every read in the block: there the device
  is the host, so the count is the one the same code makes on a device, plus any read of a value that would live
  on the host there (an upper bound; keep host-side planning out of the counted block).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import traceback

import torch
from torch.overrides import TorchFunctionMode

# A method or function whose result is a host value computed from a device tensor (a read), by name.
READS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu", "nonzero",
                   "masked_select", "unique", "unique_consecutive", "equal", "allclose", "is_nonzero"})
# Indexing with a boolean mask: the result's size is the mask's count, read from the device.
INDEXING = frozenset({"__getitem__", "index", "index_put", "index_put_", "__setitem__"})


@dataclasses.dataclass
class HostReads:
    """The reads counted so far: ``count`` and ``where`` (``file:line (what)`` -> reads there)."""

    count: int = 0
    where: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add(self, what: str) -> None:
        self.count += 1
        self.where[f"{_caller()} ({what})"] += 1


def _tensors(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def _repeats(args, kwargs):
    """``repeat_interleave``'s repeats: its second argument, or its only one (``torch.repeat_interleave(counts)``)."""
    return kwargs.get("repeats", args[1] if len(args) > 1 else (args[0] if args else None))


def _caller() -> str:
    """The first frame outside torch and this module: the code that asked for the read."""
    here = os.path.dirname(torch.__file__)
    for frame in reversed(traceback.extract_stack(sys._getframe(2), limit=40)):
        if not frame.filename.startswith(here) and frame.filename != __file__:
            return f"{os.path.relpath(frame.filename)}:{frame.lineno}"
    return "torch"


class _Counting(TorchFunctionMode):
    def __init__(self, reads: HostReads, device_type: str) -> None:
        super().__init__()
        self.reads, self.device_type = reads, device_type

    def _on_device(self, tensor: torch.Tensor) -> bool:
        return self.device_type == "cpu" or tensor.device.type == self.device_type

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS and any(self._on_device(t) for t in _tensors([*args, *kwargs.values()])):
            self.reads.add(name)
        elif name in INDEXING and len(args) > 1 and self._on_device(args[0]) and any(
                t.dtype == torch.bool for t in _tensors(args[1:2])):
            self.reads.add(f"{name} with a boolean mask")
        elif name == "repeat_interleave" and "output_size" not in kwargs and any(
                self._on_device(t) for t in _tensors([_repeats(args, kwargs)])):
            self.reads.add("repeat_interleave without output_size")
        return func(*args, **kwargs)


@contextlib.contextmanager
def count_host_reads(backend):
    """Within the block, count the host's reads of ``backend``'s device values (see the module docstring)."""
    reads = HostReads()
    with _Counting(reads, backend.device_type):
        yield reads
