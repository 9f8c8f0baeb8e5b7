"""The strict stand-in's collectives: gloo, except that a reduction of a dtype its backend did not declare is refused.

A real device's collective library reduces only some dtypes (HCCL: no float64 before Ascend950, even in a group
of one), while gloo reduces every dtype, so code that all-reduces float64 passes every CPU test and stops at its
first step on the device. ``install`` wraps, in this process, every function of ``torch.distributed`` that reduces
(all-reduce, reduce, reduce-scatter, in each of torch's spellings) and the functional collectives DTensor uses, so
that each first checks the dtypes of what it reduces; moves of data (all-gather, broadcast, send...) are untouched.
FSDP1, FSDP2 and the engine call these functions by their module attribute at call time, so their reductions are
checked too (the C++ side of torch, which calls the group directly, is not).

A device's collective library also takes device tensors only (NCCL and HCCL raise "No backend type associated
with device type cpu" on a host tensor), while gloo takes host tensors. When the backend's collectives live on a
device that is not the CPU (``install``'s ``device_type``), every collective here, moves of data included,
refuses a host tensor (``HostTensorInCollective``) before it runs. The group itself is plain gloo: a
``ProcessGroup`` subclass written in Python in front of gloo, tried first, hung now and then on a loaded machine
(two ranks waiting in the same all-reduce), and plain gloo does not.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch

# What reduces, by the module that offers it: torch.distributed's functions and DTensor's functional collectives.
# Names a torch version lacks are skipped (torch 2.10 has no reduce_scatter_single).
REDUCING = {
    "torch.distributed": ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor",
                          "reduce_scatter_single", "_reduce_scatter_base"),
    "torch.distributed._functional_collectives": ("all_reduce", "all_reduce_coalesced", "all_reduce_inplace",
                                                  "all_reduce_coalesced_inplace", "reduce_scatter_tensor",
                                                  "reduce_scatter_tensor_coalesced"),
}


# What moves data without reducing it: checked for host tensors only (on a device backend).
MOVING = {
    "torch.distributed": ("broadcast", "all_gather", "all_gather_into_tensor", "_all_gather_base", "gather",
                          "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv"),
    "torch.distributed._functional_collectives": ("all_gather_tensor", "all_to_all_single", "broadcast"),
}


class ReductionDtypeRefused(TypeError):
    """A collective was asked to reduce a dtype its backend does not declare in ``collective_reduce_dtypes``."""


class HostTensorInCollective(TypeError):
    """A collective of a backend whose collectives live on a device was handed a host tensor."""


def _tensors(argument) -> Iterable[torch.Tensor]:
    if torch.is_tensor(argument):
        yield argument
    elif isinstance(argument, (list, tuple)):
        for item in argument:
            yield from _tensors(item)


def check(backend_name: str, allowed: frozenset | None, method: str, arguments) -> None:
    """Raise ``ReductionDtypeRefused`` when a tensor among ``arguments`` has a dtype outside ``allowed``."""
    if allowed is None:
        return
    for tensor in _tensors(arguments):
        if tensor.dtype not in allowed:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in allowed))
            raise ReductionDtypeRefused(
                f"backend '{backend_name}' does not reduce {str(tensor.dtype).removeprefix('torch.')} ({method} of "
                f"a tensor of shape {tuple(tensor.shape)}): its collectives reduce {names}; reduce in one of those "
                "(or declare the dtype if the device reduces it)")


def check_on_device(backend_name: str, device_type: str, method: str, arguments) -> None:
    """Raise ``HostTensorInCollective`` when ``device_type`` is not the CPU and a tensor among ``arguments`` is on
    the host."""
    if device_type == "cpu":
        return
    for tensor in _tensors(arguments):
        if tensor.device.type == "cpu":
            raise HostTensorInCollective(
                f"backend '{backend_name}' runs its collectives on '{device_type}' tensors, but {method} got a "
                f"host tensor of shape {tuple(tensor.shape)}: move it to backend.metrics_device() (small "
                "figures) or backend.device() first")


def _checked(function, backend_name: str, allowed: frozenset | None, device_type: str, reduces: bool):
    @functools.wraps(function)
    def collective_checked(*args, **kwargs):
        arguments = [*args, *kwargs.values()]
        check_on_device(backend_name, device_type, function.__name__, arguments)
        if reduces:
            check(backend_name, allowed, function.__name__, arguments)
        return function(*args, **kwargs)

    collective_checked.strict_original = function
    return collective_checked


def _functions():
    """``(module, name, reduces)`` of every collective the rules wrap, that this torch has."""
    import importlib

    for table, reduces in ((REDUCING, True), (MOVING, False)):
        for module_name, names in table.items():
            module = importlib.import_module(module_name)
            for name in names:
                if getattr(module, name, None) is not None:
                    yield module, name, reduces


def install(backend_name: str, allowed: frozenset | None, device_type: str = "cpu") -> None:
    """Check every reduction of this process against ``allowed`` and, where ``device_type`` (the device the
    backend's collectives take tensors on) is not the CPU, every collective for host tensors (again: the new rules
    replace the old ones)."""
    for module, name, reduces in _functions():
        if not reduces and device_type == "cpu":
            continue  # nothing to check on a move of host tensors
        function = getattr(module, name)
        original = getattr(function, "strict_original", function)
        setattr(module, name, _checked(original, backend_name, allowed, device_type, reduces))


def uninstall() -> None:
    """Put torch's own functions back (tests that install in their own process need not)."""
    for module, name, _ in _functions():
        original = getattr(getattr(module, name), "strict_original", None)
        if original is not None:
            setattr(module, name, original)
