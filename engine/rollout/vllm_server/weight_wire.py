"""Weights over a process group of their own: the trainer (rank 0) and a vLLM server's workers (ranks 1..),
meeting at a TCP store the trainer hosts on its own address, each worker proving it holds the run's secret
(``wire_store.py``).

The group is the device backend's (``DeviceBackend.new_weight_group``: gloo on the CPU, NCCL on NVIDIA GPUs,
HCCL on Ascend, a plugin's own), built on that store, not the default group: the trainer's ranks already have
one, and a server must not join it. Both sides build it through the backend the trainer names, so the two halves
always speak the same library. Every tensor goes as three broadcasts from rank 0: a fixed-size header (kind,
dtype, number of dimensions, name length, element count, index dtype, shape), the name's bytes and the tensor's bytes
(any dtype travels as bytes: the library need not know it; int64 and uint8 are all it carries). A header of kind
DELTA (``rollout.vllm.weight_sync=delta``, ``engine/rollout/weight_delta.py``) carries, instead of the tensor, the
positions of its changed elements and their new values (four broadcasts). A header of kind END closes a push, so
the receiver needs no list of names in advance and the sender draws each tensor just before it goes (one sharded
unit in memory at a time).

Streams: everything here runs on the caller's current stream, never on one of its own, and each broadcast's work
is waited on before the next tensor is drawn. The policy's gathered tensors are produced on that stream, and the
library orders its collective after it: no tensor is read on another stream without a wait (a gathered unit
freed by the next draw has been sent). Both sides import only torch, ``accel_backends`` and ``weight_delta``: this
module runs in the trainer and inside vLLM's worker processes.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..weight_delta import Delta
from . import wire_store

MAX_DIMS = 8
FIELDS = 6  # kind, dtype index, ndim, name bytes, changed elements (DELTA), index dtype index (DELTA)
HEADER = FIELDS + MAX_DIMS  # then the dims
END, TENSOR, DELTA = 0, 1, 2
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)


def open_group(backend, address: str, port: int, rank: int, world_size: int, timeout_s: float, secret: str,
               store=None):
    """Join the weight group as ``rank`` of ``world_size`` through ``backend`` (a ``DeviceBackend``): its
    ``WeightGroup``. Rank 0 passes the store it hosts (``wire_store.host_store``) and admits the other ranks by
    their proofs of ``secret``; the others join the store at ``address:port`` with theirs. A gloo group blocks
    until every member joined."""
    if rank == 0:
        if store is None:
            raise ValueError("the weight group's rank 0 hosts its store: open it with wire_store.host_store first")
        group_store = wire_store.admit(store, secret, range(1, world_size), timeout_s)
    else:
        group_store = wire_store.join(address, port, rank, secret, timeout_s)
    return backend.new_weight_group(group_store, rank, world_size, timeout_s)


def _broadcast(weight_group, tensor: torch.Tensor) -> None:
    from torch.distributed import BroadcastOptions

    options = BroadcastOptions()  # torch 2.13's ProcessGroupGloo.broadcast takes options, not a bare root rank
    options.rootRank, options.rootTensor = 0, 0
    weight_group.group.broadcast([tensor], options).wait()


def send(groups: list, name: str, tensor: torch.Tensor | Delta) -> None:
    """Broadcast one named tensor, or a ``Delta`` of it, from rank 0 to every group in ``groups`` (``WeightGroup``s,
    one per server)."""
    delta = tensor if isinstance(tensor, Delta) else None
    values = delta.values if delta is not None else tensor
    shape = delta.shape if delta is not None else tuple(tensor.shape)
    if len(shape) > MAX_DIMS or values.dtype not in DTYPES:
        raise ValueError(f"weight {name!r} ({values.dtype}, {len(shape)} dimensions) cannot be sent: up to "
                         f"{MAX_DIMS} dimensions of {', '.join(str(d) for d in DTYPES)}")
    encoded = torch.tensor(list(name.encode()), dtype=torch.uint8)
    header = torch.zeros(HEADER, dtype=torch.int64)
    header[:4] = torch.tensor([TENSOR if delta is None else DELTA, DTYPES.index(values.dtype), len(shape),
                               encoded.numel()])
    if delta is not None:
        header[4:6] = torch.tensor([delta.indices.numel(), DTYPES.index(delta.indices.dtype)])
    header[FIELDS:FIELDS + len(shape)] = torch.tensor(shape, dtype=torch.int64)
    payloads = [values] if delta is None else [delta.indices, values]
    for weight_group in groups:
        _broadcast(weight_group, header.to(weight_group.device))
        _broadcast(weight_group, encoded.to(weight_group.device))
        for payload in payloads:
            flat = payload.detach().to(weight_group.device).contiguous().reshape(-1).view(torch.uint8)
            if flat.numel():
                _broadcast(weight_group, flat)


def send_end(groups: list) -> None:
    """Close the push on every group: the receivers' loops end."""
    for weight_group in groups:
        _broadcast(weight_group, torch.zeros(HEADER, dtype=torch.int64, device=weight_group.device))


def receive(weight_group) -> Iterator[tuple[str, torch.Tensor | Delta]]:
    """On a member of rank > 0: every ``(name, tensor)`` of one push (a ``Delta`` where the trainer sent one),
    until its END header, on the group's device (each is a new buffer: the caller may keep it)."""
    device = weight_group.device
    while True:
        header = torch.zeros(HEADER, dtype=torch.int64, device=device)
        _broadcast(weight_group, header)
        kind, dtype_index, ndim, name_bytes, count, index_dtype, *dims = header.tolist()
        if kind == END:
            return
        encoded = torch.zeros(name_bytes, dtype=torch.uint8, device=device)
        _broadcast(weight_group, encoded)
        shape = tuple(dims[:ndim])
        if kind == DELTA:
            indices = _received(weight_group, (count,), DTYPES[index_dtype])
            message = Delta(indices, _received(weight_group, (count,), DTYPES[dtype_index]), shape)
        else:
            message = _received(weight_group, shape, DTYPES[dtype_index])
        yield bytes(encoded.tolist()).decode(), message


def _received(weight_group, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.empty(shape, dtype=dtype, device=weight_group.device)
    payload = tensor.reshape(-1).view(torch.uint8)
    if payload.numel():
        _broadcast(weight_group, payload)
    return tensor


def backend_named(name: str):
    """The device backend ``name`` in this process (inside a vLLM server: the one the trainer named, so that both
    halves build the same library's group); a server that lacks it says so in one line."""
    from accel_backends import AccelBackendError, get_backend

    try:
        return get_backend(name)
    except AccelBackendError as exc:
        raise ValueError(f"this server cannot build the trainer's weight group: {exc}") from None
