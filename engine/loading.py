"""Rank-0 loading: only rank 0 materialises the weights; the others build on the meta device and receive shards.

Every rank building the full model before sharding costs world size x the full model in host memory and as many
reads of the checkpoint. For a model given as a path (a local Hugging Face directory) or a zero-argument factory,
rank 0 builds it for real and every other rank builds the same structure on the meta device (no storage). After
sharding, the other ranks allocate only their shards and receive them from rank 0, one tensor (FSDP2) or one
unit (FSDP1) at a time, so their peak host memory is about their shard plus the largest tensor or unit.

A model given as an ``nn.Module`` already exists on every rank: it is used as it is (and the ranks' weights are
compared, ``sharding.check_same_weights``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

ModelSource = nn.Module | Callable[[], nn.Module] | str | os.PathLike


def check_source(model: ModelSource) -> None:
    """Refuse what cannot be a model before any process-group work, saying what would be accepted."""
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not (path / "config.json").is_file():
            raise ValueError(f"model path {str(model)!r} is not a local Hugging Face model directory (no "
                             "config.json there): pass a directory written by save_pretrained (download hub "
                             "models first), an nn.Module, or a zero-argument factory")
        return
    if not isinstance(model, nn.Module) and not callable(model):
        raise TypeError(f"model must be an nn.Module, a zero-argument factory or a local Hugging Face model "
                        f"directory, got {type(model).__name__}")


def build(model: ModelSource, rank: int, world_size: int, on_rank0: bool) -> tuple[nn.Module, bool]:
    """This rank's model and whether its weights must come from rank 0 (it was built on the meta device)."""
    if isinstance(model, nn.Module):
        return model, False
    spread = on_rank0 and world_size > 1
    if isinstance(model, (str, os.PathLike)):
        return _from_directory(Path(model), meta=spread and rank != 0), spread
    if not spread:
        return _checked(model()), False
    if rank == 0:
        return _checked(model()), True
    try:
        with torch.device("meta"):
            built = _checked(model())
    except Exception as error:  # noqa: BLE001 - e.g. from_pretrained refuses a meta context: build it for real
        first_line = (str(error).splitlines() or [""])[0]
        warnings.warn(f"the model factory cannot run on the meta device ({type(error).__name__}: {first_line}); "
                      "building it in full on this rank, which costs the host memory rank-0 loading would save: "
                      "pass the model directory instead of a factory that loads it", stacklevel=3)
        built = _checked(model())
    return built, True


def _checked(built) -> nn.Module:
    if not isinstance(built, nn.Module):
        raise TypeError(f"the model factory returned {type(built).__name__}, not an nn.Module")
    return built


def _from_directory(path: Path, meta: bool) -> nn.Module:
    """A causal LM from a saved directory, in fp32 (the engine keeps fp32 master weights); empty on meta."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if meta:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def fsdp1_materializer(device: torch.device) -> Callable[[nn.Module], None]:
    """FSDP1 ``param_init_fn``: allocate a module's own meta tensors (uninitialised; rank 0 sends the values).

    One memo for the whole model keeps tied weights tied (``to_empty`` per module would untie them).
    """
    memo: dict[int, nn.Parameter] = {}

    def materialize(module: nn.Module) -> None:
        for name, param in list(module._parameters.items()):
            if param is not None and param.is_meta:
                if id(param) not in memo:
                    memo[id(param)] = nn.Parameter(torch.empty_like(param, device=device),
                                                   requires_grad=param.requires_grad)
                module._parameters[name] = memo[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_meta:
                module._buffers[name] = torch.empty_like(buffer, device=device)

    return materialize


def receive_from_rank0(module: nn.Module, fsdp_version: int, device: torch.device,
                       full_state: dict[str, torch.Tensor] | None) -> None:
    """After sharding: every rank's shards take rank 0's values (``full_state``: rank 0's unsharded state dict).

    FSDP2: ``set_model_state_dict(broadcast_from_rank0=True)`` broadcasts one tensor at a time and keeps this
    rank's slice. FSDP1: each unit is gathered in turn, rank 0 fills it from ``full_state`` and broadcasts it,
    and every rank writes its shard back. Buffers (non-persistent ones such as rotary tables are in no state
    dict) are broadcast last.
    """
    if fsdp_version == 2:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(module, full_state if dist.get_rank() == 0 else {}, options=options)
    else:
        _fsdp1_receive(module, full_state)
    with torch.no_grad():
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)


def _fsdp1_receive(module: nn.Module, full_state: dict[str, torch.Tensor] | None) -> None:
    """Per unit: gather it (shards of other ranks are uninitialised), take rank 0's full values, write back."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    prefixes = {id(m): name for name, m in module.named_modules()}
    for unit in FullyShardedDataParallel.fsdp_modules(module):
        with FullyShardedDataParallel.summon_full_params(unit, recurse=False, writeback=True), torch.no_grad():
            for name, param in _own_parameters(unit, prefixes[id(unit)]):
                if full_state is not None:
                    param.copy_(full_state[_clean(name)])
                dist.broadcast(param.data, src=0)


def _own_parameters(unit: nn.Module, prefix: str):
    """(full name, parameter) of an FSDP1 unit's parameters that no nested unit owns, each once."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    seen: set[int] = set()
    stack = [(prefix, unit)]
    while stack:
        path, current = stack.pop()
        for name, param in current.named_parameters(recurse=False):
            if id(param) not in seen and param.numel() > 0:
                seen.add(id(param))
                yield (f"{path}.{name}" if path else name), param
        stack.extend((f"{path}.{n}" if path else n, c) for n, c in current.named_children()
                     if not isinstance(c, FullyShardedDataParallel))


def _clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "")


def fingerprint(named_tensors, fsdp1_prefixes: bool = False) -> float:
    """A sharding-independent checksum: summed over ranks' shards it equals the full model's (up to rounding)."""
    from .offload import local

    total = 0.0
    with torch.no_grad():
        for name, tensor in named_tensors:
            clean = _clean(name) if fsdp1_prefixes else name
            weight = 1 + sum(clean.encode()) % 7
            total += weight * local(tensor).double().sum().item()
    return total


def check_received(module: nn.Module, fsdp_version: int, expected: float | None, device: torch.device) -> None:
    """Fail loudly if the shards do not add up to the weights rank 0 built (a broadcast that missed a tensor)."""
    mine = fingerprint(module.named_parameters(), fsdp1_prefixes=fsdp_version == 1)
    packed = torch.tensor([mine, expected if expected is not None else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(packed)
    got, want = packed.tolist()
    if abs(got - want) > 1e-6 * max(1.0, abs(want)):
        raise RuntimeError(f"rank-0 loading failed: the ranks' shards sum to {got!r}, rank 0 built {want!r}; "
                           "set EngineConfig.load_on_rank0=False to build the model on every rank")
