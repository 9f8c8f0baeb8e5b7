"""Rank-0 loading: only rank 0 materialises the weights; the others build on the meta device and receive shards.

Every rank building the full model before sharding costs world size x the full model in host memory and as many
reads of the checkpoint. For a model given as a path (a local Hugging Face directory) or a zero-argument factory,
rank 0 builds it for real and every other rank builds the same structure on the meta device (no storage). After
sharding, the other ranks allocate only their shards and rank 0 sends each of them exactly its slices, received
in place. FSDP2 allocates shards alone, so a receiving rank's peak is about its shard; FSDP1 builds each unit's
full flat parameter while wrapping, so there it is about its shard plus the largest unit (docs/engine.md has the
measured figures).

A model given as an ``nn.Module`` already exists on every rank: it is used as it is (and the ranks' weights are
compared, ``sharding.check_same_weights``).
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from . import private_state
from .offload import local

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


def _glibc_malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


_MALLOC_TRIM = _glibc_malloc_trim()


def _return_freed_memory() -> None:
    """Hand freed heap memory back to the system: glibc keeps it mapped, and resident, otherwise."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def fsdp1_materializer(device: torch.device) -> Callable[[nn.Module], None]:
    """FSDP1 ``param_init_fn``: allocate a module's own meta tensors (uninitialised; rank 0 sends the values).

    One memo for the whole model keeps tied weights tied (``to_empty`` per module would untie them). FSDP1 builds
    each unit's full flat parameter and frees it once sharded; freed heap pages stay resident under glibc, so each
    call first returns them, or this rank's peak would grow by about half of every unit it has wrapped.
    """
    memo: dict[int, nn.Parameter] = {}

    def materialize(module: nn.Module) -> None:
        _return_freed_memory()
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

    Rank 0 sends each rank exactly the slices of its weights that the rank's shard holds, received straight into
    the shard: no unit is gathered and nothing is received into a temporary, so a receiving rank needs no memory
    beyond its shard (a broadcast would put every full tensor on every rank). Rank 0 learns each rank's slices
    first (one small object gather). Buffers (non-persistent ones such as rotary tables are in no state dict) are
    broadcast last.
    """
    pieces, problem = _fsdp1_pieces(module) if fsdp_version == 1 else _fsdp2_pieces(module)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    everyone = [None] * world_size if rank == 0 else None
    dist.gather_object((problem, [(key, start, end) for key, _, start, end in pieces]), everyone, dst=0)
    verdict = [next((p for p, _ in everyone if p), None) if rank == 0 else None]
    dist.broadcast_object_list(verdict, src=0)  # a problem on any rank stops every rank, none waits for a send
    if verdict[0]:
        raise RuntimeError(f"rank-0 loading: {verdict[0]}; set EngineConfig.load_on_rank0=False")
    with torch.no_grad():
        if rank != 0:
            for _, shard, _, _ in pieces:
                dist.recv(shard, src=0)
        else:
            for key, shard, start, end in pieces:
                shard.copy_(full_state[key].reshape(-1)[start:end])
            for other in range(1, world_size):
                for key, start, end in everyone[other][1]:
                    dist.send(full_state[key].reshape(-1)[start:end].to(device), dst=other)
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)


def _fsdp1_pieces(module: nn.Module) -> tuple[list[tuple[str, torch.Tensor, int, int]], str | None]:
    """(state-dict key, this rank's shard of it, start, end) for each piece of this rank's shards, where the shard
    is ``full[key].reshape(-1)[start:end]``; and what stops rank-0 loading here, if anything.

    With ``use_orig_params`` each parameter's shard is a view into its unit's flat shard.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel


    pieces = []
    for prefix, unit in module.named_modules():
        if isinstance(unit, FullyShardedDataParallel):
            for name, start, end in private_state.fsdp1_local_pieces(unit):
                key = _clean(f"{prefix}.{name}" if prefix else name)
                pieces.append((key, unit.module.get_parameter(name).data, start, end))
    return pieces, None


def _fsdp2_pieces(module: nn.Module) -> tuple[list[tuple[str, torch.Tensor, int, int]], str | None]:
    """As ``_fsdp1_pieces``. FSDP2 shards each parameter on dim 0 in ``torch.chunk`` pieces: rank r holds rows
    from r x ceil(rows / world size), a contiguous range of the flattened parameter."""
    from torch.distributed.tensor import DTensor, Shard

    rank, world_size = dist.get_rank(), dist.get_world_size()
    pieces = []
    for key, param in module.named_parameters():
        if not isinstance(param, DTensor) or tuple(param.placements) != (Shard(0),):
            return [], f"expected FSDP2 to shard {key} on dim 0, found {getattr(param, 'placements', 'no DTensor')}"
        shard, rows = param.to_local(), param.shape[0]
        chunk = -(-rows // world_size)
        if shard.shape[0] != max(0, min(chunk, rows - rank * chunk)):
            return [], (f"expected {key} sharded as torch.chunk does, found {shard.shape[0]} of {rows} rows on "
                        f"rank {rank}")
        if shard.numel():
            start = rank * chunk * (param.numel() // rows)
            pieces.append((key, shard.view(-1), start, start + shard.numel()))
    return pieces, None


def _clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "")


def fingerprint(named_tensors, fsdp1_prefixes: bool = False) -> int:
    """A sharding-independent checksum of the tensors' bits: summed over ranks' shards it equals the full model's,
    exactly (integers: it travels as int64, and no float64 is computed on the device)."""
    total = 0
    with torch.no_grad():
        for name, tensor in named_tensors:
            clean = _clean(name) if fsdp1_prefixes else name
            weight = 1 + sum(clean.encode()) % 7
            total += weight * bits_checksum(local(tensor))
    return total


def bits_checksum(tensor: torch.Tensor, chunk: int = 1 << 16) -> int:
    """The sum of ``tensor``'s bits read as unsigned 16-bit pieces (bytes for a 1-byte dtype), in int64 on its
    device, a chunk at a time: an int64 copy of the whole tensor would be the peak of loading. The same bits give
    the same sum on every device, and any change of a piece changes it (exact for models below 2**40 elements)."""
    total = torch.zeros((), dtype=torch.int64, device=tensor.device)
    flat = tensor.detach().reshape(-1)
    with torch.no_grad():
        for piece in flat.split(chunk):
            if piece.element_size() == 1:
                units = piece.view(torch.uint8).to(torch.int32)
            else:
                units = piece.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
            total += units.sum(dtype=torch.int64)  # each chunk reuses the last one's memory
    return int(total.item())


def check_received(module: nn.Module, fsdp_version: int, expected: int | None, device: torch.device) -> None:
    """Fail loudly if the shards do not add up to the weights rank 0 built (a broadcast that missed a tensor)."""
    mine = fingerprint(module.named_parameters(), fsdp1_prefixes=fsdp_version == 1)
    packed = torch.tensor([mine, expected if expected is not None else 0], dtype=torch.int64).to(device)
    dist.all_reduce(packed)
    got, want = packed.tolist()
    if got != want:
        raise RuntimeError(f"rank-0 loading failed: the ranks' shards sum to {got!r}, rank 0 built {want!r}; "
                           "set EngineConfig.load_on_rank0=False to build the model on every rank")
