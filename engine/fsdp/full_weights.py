"""Full (unsharded) weights by name, one sharded unit at a time.

A rollout engine that keeps its own copy of the model (vLLM, SGLang, a test double) needs the policy's weights
after every update. Gathering the whole state dict first would hold a full copy of the model on every rank; here
one unit is gathered (one all-gather for FSDP2, one for FSDP1), its tensors are handed out, and it is resharded
before the next unit, so the extra memory is one unit (the largest is usually the root: embeddings and output
layer). Names are those of the user's model (FSDP1's wrapper prefixes removed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn as nn

from . import private_state
from .sharding import UNWRAPPED


def unit_weights(module: nn.Module, fsdp_version: int) -> Iterator[dict[str, torch.Tensor]]:
    """Each sharded unit's own parameters, gathered, as ``{name: full tensor}`` (the root's first).

    The tensors are views of the gathered unit: valid until the next unit is requested (copy them to keep them).
    An unwrapped model (one rank) is one unit, its parameters as they are.
    """
    if fsdp_version == UNWRAPPED:
        yield dict(_own_parameters(module, is_other_unit=lambda m: False))
    elif fsdp_version == 2:
        yield from _fsdp2_units(module)
    else:
        yield from _fsdp1_units(module)


def _own_parameters(module: nn.Module, is_other_unit: Callable[[nn.Module], bool], prefix: str = "",
                     seen: set[int] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``module``'s parameters that belong to no nested unit, named from ``module`` (each tensor once)."""
    seen = set() if seen is None else seen
    for name, param in module.named_parameters(recurse=False):
        if id(param) not in seen:
            seen.add(id(param))
            yield prefix + name, param.detach()
    for child_name, child in module.named_children():
        if not is_other_unit(child):
            yield from _own_parameters(child, is_other_unit, f"{prefix}{child_name}.", seen)


def _fsdp2_units(root: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    from torch.distributed.fsdp import FSDPModule

    private_state.lazy_init(root)  # unshard() below the root must not make a layer claim to be the root
    prefixes = {id(sub): name for name, sub in root.named_modules()}
    for unit in private_state.fsdp2_units(root):
        prefix = prefixes[id(unit)] + "." if prefixes[id(unit)] else ""
        unit.unshard()  # public; the unit's parameters are plain full tensors until reshard()
        try:
            yield dict(_own_parameters(unit, lambda m, u=unit: m is not u and isinstance(m, FSDPModule), prefix))
        finally:
            try:
                unit.reshard()
            except RuntimeError as exc:
                if "not resizable" not in str(exc):
                    raise
                raise RuntimeError("a full weight was shared outside the engine (e.g. tensor.numpy(), which pins "
                                   "FSDP's gathered buffer): copy each tensor (param.copy_(tensor), "
                                   "tensor.clone()) instead of keeping it") from exc


def _fsdp1_units(root: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    prefixes = {id(sub): _clean(name) for name, sub in root.named_modules()}
    for unit in FSDP.fsdp_modules(root):  # the root first: its summon also initialises FSDP lazily
        prefix = prefixes[id(unit)] + "." if prefixes[id(unit)] else ""
        with FSDP.summon_full_params(unit, recurse=False, writeback=False):
            own = _own_parameters(unit, lambda m, u=unit: m is not u and isinstance(m, FSDP))
            yield {prefix + _clean(name): tensor for name, tensor in own}


def _clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "").replace("_fsdp_wrapped_module", "")
