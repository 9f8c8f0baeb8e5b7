"""The strict stand-in's process group: gloo underneath, refusing to reduce a dtype its backend did not declare.

A real device's collective library reduces only some dtypes (HCCL: no float64 before Ascend950, even in a group
of one), while gloo reduces every dtype, so code that all-reduces float64 passes every CPU test and stops at its
first step on the device. This group is a ``torch.distributed.ProcessGroup`` written in Python with a gloo backend
registered under it: moves of data (all-gather, broadcast, send...) go straight to gloo; every reduction
(all-reduce, reduce, reduce-scatter, in each of torch's spellings, functional collectives included) first checks
the dtypes of what it reduces. It is registered with ``torch.distributed`` under the backend's ``dist_backend``
name, so ``init_process_group``, ``new_group`` and device meshes all make it.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable

import torch
import torch.distributed as dist


class ReductionDtypeRefused(TypeError):
    """A collective was asked to reduce a dtype its backend does not declare in ``collective_reduce_dtypes``."""


def _tensors(argument) -> Iterable[torch.Tensor]:
    if torch.is_tensor(argument):
        yield argument
    elif isinstance(argument, (list, tuple)):
        for item in argument:
            yield from _tensors(item)


class StrictProcessGroup(dist.ProcessGroup):
    """gloo, except that reductions of a dtype outside ``allowed`` (``None``: every dtype) raise
    ``ReductionDtypeRefused``."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, allowed: frozenset | None,
                 name: str):
        super().__init__(rank, size)
        self.allowed, self.backend_name = allowed, name
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout=timeout)
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        self._set_default_backend(dist.ProcessGroup.BackendType.GLOO)

    def check(self, method: str, reduced) -> None:
        for tensor in _tensors(reduced):
            if self.allowed is not None and tensor.dtype not in self.allowed:
                names = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.allowed))
                raise ReductionDtypeRefused(
                    f"backend '{self.backend_name}' does not reduce {str(tensor.dtype).removeprefix('torch.')} "
                    f"({method} of a tensor of shape {tuple(tensor.shape)}): its collectives reduce {names}; "
                    "reduce in one of those (or declare the dtype if the device reduces it)")

    def getBackendName(self) -> str:  # noqa: N802 - the name torch's ProcessGroup calls
        return self.backend_name

    # Every method of ProcessGroup that reduces, its first argument what is reduced into. Each is written out:
    # torch's C++ side calls these through pybind11, which tells a call from an override by the method's own name
    # (a generated wrapper would recurse). torch 2.10 lacks the *_single spellings; defining them is harmless.
    def allreduce(self, reduced, *args):
        self.check("allreduce", reduced)
        return super().allreduce(reduced, *args)

    def allreduce_coalesced(self, reduced, *args):
        self.check("allreduce_coalesced", reduced)
        return super().allreduce_coalesced(reduced, *args)

    def reduce(self, reduced, *args):
        self.check("reduce", reduced)
        return super().reduce(reduced, *args)

    def reduce_scatter(self, reduced, *args):
        self.check("reduce_scatter", reduced)
        return super().reduce_scatter(reduced, *args)

    def _reduce_scatter_base(self, reduced, *args):
        self.check("_reduce_scatter_base", reduced)
        return super()._reduce_scatter_base(reduced, *args)

    def reduce_scatter_single(self, reduced, *args):
        self.check("reduce_scatter_single", reduced)
        return super().reduce_scatter_single(reduced, *args)

    def reduce_scatter_tensor_coalesced(self, reduced, *args):
        self.check("reduce_scatter_tensor_coalesced", reduced)
        return super().reduce_scatter_tensor_coalesced(reduced, *args)

    def reduce_scatter_single_coalesced(self, reduced, *args):
        self.check("reduce_scatter_single_coalesced", reduced)
        return super().reduce_scatter_single_coalesced(reduced, *args)


def register(name: str, allowed: frozenset | None) -> None:
    """Make ``init_process_group(backend=name)`` (and ``new_group``) build a ``StrictProcessGroup``."""

    def create(store, rank, size, timeout):
        return StrictProcessGroup(store, rank, size, timeout, allowed, name)

    dist.Backend.register_backend(name, create, devices=["cpu"])
