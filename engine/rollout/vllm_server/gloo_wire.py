"""Weights over a torch.distributed gloo group of their own: the trainer (rank 0) and a vLLM server's workers
(ranks 1..), meeting at a TCP store the trainer hosts.

The group is a ``ProcessGroupGloo`` built directly on that store, not the default group: the trainer's ranks
already have one, and a server must not join it. Every tensor goes as three broadcasts from rank 0: a fixed-size
header (kind, dtype, number of dimensions, name length, shape), the name's bytes and the tensor's bytes (any dtype
travels as bytes: gloo need not know it). A header of kind END closes a push, so the receiver needs no list of
names in advance and the sender draws each tensor just before it goes (one sharded unit in memory at a time).
Both sides import only torch: this module runs in the trainer and inside vLLM's worker processes.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import torch

MAX_DIMS = 8
HEADER = 4 + MAX_DIMS  # kind, dtype index, ndim, name bytes, dims...
END, TENSOR = 0, 1
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)


def open_group(address: str, port: int, rank: int, world_size: int, timeout_s: float, store=None):
    """Join the weight group as ``rank`` of ``world_size`` (rank 0 hosts the store at ``address:port``). Blocks
    until every member joined. ``store``: rank 0's store when it was opened already (``host_store``)."""
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)
    return ProcessGroupGloo(PrefixStore("accel-weights", store), rank, world_size, timeout)


def host_store(address: str, port: int, world_size: int, timeout_s: float):
    """Rank 0's store, listening before the other members are told where to meet (returns at once)."""
    from torch.distributed import TCPStore

    return TCPStore(address, port, world_size, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout_s))


def _broadcast(group, tensor: torch.Tensor) -> None:
    from torch.distributed import BroadcastOptions

    options = BroadcastOptions()  # torch 2.13's ProcessGroupGloo.broadcast takes options, not a bare root rank
    options.rootRank, options.rootTensor = 0, 0
    group.broadcast([tensor], options).wait()


def send(groups: list, name: str, tensor: torch.Tensor) -> None:
    """Broadcast one named tensor from rank 0 to every group in ``groups`` (one per server)."""
    if tensor.dim() > MAX_DIMS or tensor.dtype not in DTYPES:
        raise ValueError(f"weight {name!r} ({tensor.dtype}, {tensor.dim()} dimensions) cannot be sent: up to "
                         f"{MAX_DIMS} dimensions of {', '.join(str(d) for d in DTYPES)}")
    encoded = torch.tensor(list(name.encode()), dtype=torch.uint8)
    header = torch.zeros(HEADER, dtype=torch.int64)
    header[:4] = torch.tensor([TENSOR, DTYPES.index(tensor.dtype), tensor.dim(), encoded.numel()])
    header[4:4 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    payload = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    for group in groups:
        _broadcast(group, header)
        _broadcast(group, encoded)
        if payload.numel():
            _broadcast(group, payload)


def send_end(groups: list) -> None:
    """Close the push on every group: the receivers' loops end."""
    header = torch.zeros(HEADER, dtype=torch.int64)
    for group in groups:
        _broadcast(group, header)


def receive(group) -> Iterator[tuple[str, torch.Tensor]]:
    """On a member of rank > 0: every ``(name, tensor)`` of one push, until its END header."""
    while True:
        header = torch.zeros(HEADER, dtype=torch.int64)
        _broadcast(group, header)
        kind, dtype_index, ndim, name_bytes = (int(v) for v in header[:4])
        if kind == END:
            return
        encoded = torch.zeros(name_bytes, dtype=torch.uint8)
        _broadcast(group, encoded)
        dtype, shape = DTYPES[dtype_index], [int(v) for v in header[4:4 + ndim]]
        tensor = torch.empty(shape, dtype=dtype)
        payload = tensor.reshape(-1).view(torch.uint8)
        if payload.numel():
            _broadcast(group, payload)
        yield bytes(encoded.tolist()).decode(), tensor
