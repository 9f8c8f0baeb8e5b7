"""Where parameters, gradients and optimizer state live, and the moves between host and device.

Every move goes through the backend (``to_host`` pins host memory where the device supports it) and is reported
with its byte count and time. Where the backend pins host memory the copies are queued non-blocking, so they
overlap each other and the host-side bookkeeping; each move synchronises once, after its copies are queued (for
FSDP2 before its shards are re-padded: ``_move_fsdp2``). A part that is already where it is asked to go is not
touched.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from . import private_state

DEVICE, HOST = "device", "cpu"
PARTS = ("params", "grads", "optimizer")


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The shard this rank holds (FSDP2 parameters, gradients and optimizer state are DTensors)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _nbytes(tensor: torch.Tensor) -> int:
    shard = local(tensor)
    return shard.numel() * shard.element_size()


def _mover(backend, destination: str, non_blocking: bool | None = None):
    copy = backend.to_device if destination == DEVICE else backend.to_host
    if non_blocking is None:
        non_blocking = bool(backend.supports_pinned_memory)  # pinned host memory makes copies asynchronous

    def move(tensor: torch.Tensor) -> torch.Tensor:
        return copy(tensor, non_blocking=non_blocking)

    def apply(tensor: torch.Tensor) -> torch.Tensor:
        if isinstance(tensor, DTensor):
            moved = move(tensor.to_local())
            return DTensor.from_local(moved, tensor.device_mesh, tensor.placements, run_check=False,
                                      shape=tensor.shape, stride=tensor.stride())
        return move(tensor)

    return apply


def model_bytes(module: nn.Module, fsdp_version: int) -> tuple[int, int]:
    """Bytes this rank holds in (parameters + buffers, gradients)."""
    if fsdp_version == 1:
        flats = private_state.fsdp1_flat_params(module)
        params = sum(_nbytes(f) for f in flats)
        grads = sum(_nbytes(f.grad) for f in flats if f.grad is not None)
    else:
        params = sum(_nbytes(p) for p in module.parameters())
        grads = sum(_nbytes(p.grad) for p in module.parameters() if p.grad is not None)
    return params + sum(_nbytes(b) for b in module.buffers()), grads


def move_model(module: nn.Module, fsdp_version: int, backend, destination: str) -> None:
    """Move this rank's parameter shards, buffers and any gradients (a gradient lives with its parameter); every
    copy has landed when it returns (one ``synchronize``)."""
    apply = _mover(backend, destination)
    with torch.no_grad():
        if fsdp_version != 1:
            _move_fsdp2(module, backend, apply, _mover(backend, destination, non_blocking=False))
            return
        private_state.fsdp1_move_shards(module, apply)
        for sub in module.modules():
            for name, buffer in sub._buffers.items():
                if buffer is not None:
                    sub._buffers[name] = apply(buffer)
    backend.synchronize()


def _move_fsdp2(module: nn.Module, backend, apply, apply_blocking) -> None:
    """FSDP2 (or an unwrapped model) through ``Module._apply``, with every copy landed before FSDP2 re-pads.

    FSDP2's ``FSDPModule._apply`` ends with ``reset_sharded_param()``, which re-pads a shard shorter than its padded
    size (the last ranks' shards of a dim the world size does not divide) by an immediate copy of what the move
    returned: a non-blocking device-to-host copy not landed yet would be copied as garbage. So every tensor
    ``_apply`` visits is moved first, the copies land (the one ``synchronize``), and only then does ``_apply`` swap
    them in; one it visits that was not moved ahead is moved blocking.
    """
    from torch.distributed.fsdp import FSDPModule

    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()  # what _apply would do first: the sharded parameters are the registered ones
    ahead: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for sub in module.modules():
        for tensor in (*sub._parameters.values(), *sub._buffers.values()):
            for visited in (tensor, getattr(tensor, "grad", None)):
                if visited is not None and id(visited) not in ahead:
                    ahead[id(visited)] = (visited, apply(visited))
    backend.synchronize()

    def landed(tensor: torch.Tensor) -> torch.Tensor:
        source, moved = ahead.get(id(tensor), (None, None))
        return moved if source is tensor else apply_blocking(tensor)

    module._apply(landed)


def drop_gradients(module: nn.Module, fsdp_version: int) -> None:
    """Free every gradient; FSDP1 also keeps a flat gradient behind the per-parameter views."""
    for param in module.parameters():
        param.grad = None
    if fsdp_version == 1:
        private_state.fsdp1_drop_flat_gradients(module)


def optimizer_tensors(optimizer: torch.optim.Optimizer):
    """(state dict, key) of every per-parameter state tensor; scalar step counters stay where they are."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                yield state, key


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(_nbytes(state[key]) for state, key in optimizer_tensors(optimizer))


def move_optimizer(optimizer: torch.optim.Optimizer, backend, destination: str) -> None:
    """Move every per-parameter state tensor; every copy has landed when it returns (one ``synchronize``)."""
    apply = _mover(backend, destination)
    for state, key in list(optimizer_tensors(optimizer)):
        state[key] = apply(state[key])
    backend.synchronize()
