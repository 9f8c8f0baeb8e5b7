"""A LoRA policy's adapter alone, gathered from its shards, and its base weights under the plain model's names.

A rollout engine that serves the base model with LoRA (``rollout.vllm.lora_sync=adapter``) needs, after every
update, only the trained adapter: gathering whole units would move the frozen base weights too. Here every rank
contributes its local pieces of the adapter's tensors (FSDP2: each DTensor's ``to_local()`` rows; FSDP1 with
``use_orig_params``: each parameter's view of the rank's flat shard), flattened: the pieces of a tensor, in rank
order, are its whole data (both wrappers cut a tensor, or the flat parameter holding it, into consecutive chunks by
rank). So one all-gather of the pieces' sizes and one of the pieces themselves give every rank the whole adapter,
whatever the number of layers: two collectives per push, the base weights never gathered.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

from .sharding import UNWRAPPED

ADAPTER_MARK = ".lora_"


def _clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "").replace("_fsdp_wrapped_module", "")


def adapter_parameters(module: nn.Module, adapter: str = "default") -> list[tuple[str, nn.Parameter, nn.Module]]:
    """Each LoRA tensor's name as a PEFT adapter file has it (wrapper prefixes and the adapter's own name removed:
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``), the parameter and the module owning it."""
    found = []
    for owner_name, owner in module.named_modules():
        for leaf, param in owner.named_parameters(recurse=False):
            name = _clean(f"{owner_name}.{leaf}" if owner_name else leaf)
            if ADAPTER_MARK in name:
                found.append((name.replace(f".{adapter}.", "."), param, owner))
    return found


def _full_shape(param: nn.Parameter, owner: nn.Module, fsdp_version: int) -> tuple[int, ...]:
    """The tensor's whole shape: a DTensor knows it; FSDP1's flat views do not, so the owning layer says it (LoRA's
    A and B are linear layers: ``(out_features, in_features)``; an embedding's are plain parameters FSDP1 keeps
    whole only if unsharded)."""
    if fsdp_version != 1:
        return tuple(param.shape)
    if isinstance(owner, nn.Linear):
        return (owner.out_features, owner.in_features)
    raise ValueError(f"cannot gather the adapter of a {type(owner).__name__} under FSDP1: only linear LoRA layers "
                     "(lora_target_modules) are supported there; use fsdp_version=2")


def _local_piece(param: torch.Tensor, fsdp_version: int) -> torch.Tensor:
    local = param.to_local() if fsdp_version == 2 else param
    return local.detach().reshape(-1)


def gather_adapter(module: nn.Module, fsdp_version: int, dtype: torch.dtype,
                   adapter: str = "default") -> Iterator[tuple[str, torch.Tensor]]:
    """``(adapter-file name, whole tensor in dtype)`` for every tensor of ``module``'s LoRA adapter named
    ``adapter`` (a collective: every rank calls it and consumes it). The tensors are the rank's own copies."""
    params = adapter_parameters(module, adapter)
    if fsdp_version == UNWRAPPED or not dist.is_initialized() or dist.get_world_size() == 1:
        for name, param, _ in params:
            local = param.to_local() if fsdp_version == 2 else param
            yield name, local.detach().to(dtype).clone()
        return
    shapes = [_full_shape(param, owner, fsdp_version) for _, param, owner in params]
    pieces = [_local_piece(param, fsdp_version).to(dtype) for _, param, _ in params]
    device = pieces[0].device if pieces else torch.device("cpu")
    world = dist.get_world_size()
    counts = torch.tensor([piece.numel() for piece in pieces], dtype=torch.int64, device=device)
    every_count = _all_gather(counts, world).view(world, len(pieces)).cpu()
    width = int(every_count.sum(dim=1).max())
    mine = torch.zeros(width, dtype=dtype, device=device)
    if pieces:
        flat = torch.cat(pieces)
        mine[:flat.numel()] = flat
    gathered = _all_gather(mine, world).view(world, width)
    starts = torch.cumsum(every_count, dim=1) - every_count  # where each piece begins in its rank's row
    for index, ((name, _, _), shape) in enumerate(zip(params, shapes, strict=True)):
        parts = [gathered[rank, int(starts[rank, index]):int(starts[rank, index] + every_count[rank, index])]
                 for rank in range(world)]
        whole = torch.cat(parts)
        if whole.numel() != torch.Size(shape).numel():
            raise RuntimeError(f"adapter tensor {name!r}: gathered {whole.numel()} values for shape {shape}")
        yield name, whole.view(shape)


def _all_gather(tensor: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's ``tensor`` (same size on all), end to end in rank order."""
    out = torch.empty(world * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch 2.13 / 2.10's name
    gather(out, tensor)
    return out


def base_weights(unit: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One gathered unit's base weights under the plain model's names (``...q_proj.base_layer.weight`` ->
    ``...q_proj.weight``, PEFT's ``base_model.model.`` prefix dropped), the adapter's tensors left out."""
    return {name.removeprefix("base_model.model.").replace(".base_layer.", "."): tensor
            for name, tensor in unit.items() if ADAPTER_MARK not in name}
