"""The strict stand-in's collectives: gloo, except that a reduction of a dtype its backend did not declare is refused.

A real device's collective library reduces only some dtypes (HCCL: no float64 before Ascend950, even in a group
of one), while gloo reduces every dtype, so code that all-reduces float64 passes every CPU test and stops at its
first step on the device. ``install`` wraps, in this process, every function of ``torch.distributed`` that reduces
(all-reduce, reduce, reduce-scatter, in each of torch's spellings) and the functional collectives DTensor uses, so
that each first checks the dtypes of what it reduces; moves of data (all-gather, broadcast, send...) are untouched.
FSDP1, FSDP2 and the engine call these functions by their module attribute at call time, so their reductions are
checked too (the C++ side of torch, which calls the group directly, is not). The group itself is plain gloo: a
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


class ReductionDtypeRefused(TypeError):
    """A collective was asked to reduce a dtype its backend does not declare in ``collective_reduce_dtypes``."""


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


def _checked(function, backend_name: str, allowed: frozenset | None):
    @functools.wraps(function)
    def reduce_checked(*args, **kwargs):
        check(backend_name, allowed, function.__name__, [*args, *kwargs.values()])
        return function(*args, **kwargs)

    reduce_checked.strict_original = function
    return reduce_checked


def install(backend_name: str, allowed: frozenset | None) -> None:
    """Check every reduction of this process against ``allowed`` (again: the new set replaces the old one)."""
    import importlib

    for module_name, names in REDUCING.items():
        module = importlib.import_module(module_name)
        for name in names:
            function = getattr(module, name, None)
            if function is None:
                continue
            original = getattr(function, "strict_original", function)
            setattr(module, name, _checked(original, backend_name, allowed))


def uninstall() -> None:
    """Put torch's own functions back (tests that install in their own process need not)."""
    import importlib

    for module_name, names in REDUCING.items():
        module = importlib.import_module(module_name)
        for name in names:
            original = getattr(getattr(module, name, None), "strict_original", None)
            if original is not None:
                setattr(module, name, original)
