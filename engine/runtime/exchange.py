"""Every rank's rows, on every rank: an all-gather of tensors whose row counts and widths differ by rank.

Trainers that balance work across ranks need the whole batch's data on each rank (then each takes its share by a
plan every rank computes alike). Ranks may hold different numbers of rows (a filter kept more on one) and
different widths (their longest sequence differs): the sizes are gathered first, then each tensor, zero-padded to
the largest size, in one all-gather. The result stacks the ranks' rows in rank order, padded with zeros to the
widest rank's width.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def on_every_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on every rank (one all-reduce: every rank must call it)."""
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return value.item() == 1.0


def on_any_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on at least one rank (one all-reduce: every rank must call it)."""
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item() == 1.0


def all_gather_rows(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``{name: cat over ranks of that rank's tensor}`` along dim 0, on the host; 1 + len(tensors) all-gathers.

    Every rank passes the same names with the same dtypes and numbers of dimensions (1-D or 2-D); ``device`` is
    where the backend's collectives take tensors (``backend.metrics_device()``).
    """
    names = sorted(tensors)
    world = dist.get_world_size()
    for name in names:
        if tensors[name].dim() not in (1, 2):
            raise ValueError(f"all_gather_rows takes 1-D or 2-D tensors; {name!r} has shape "
                             f"{tuple(tensors[name].shape)}")
    sizes = torch.tensor([[*tensors[n].shape, *([0] if tensors[n].dim() == 1 else [])] for n in names],
                         dtype=torch.long, device=device)
    everyone = [torch.empty_like(sizes) for _ in range(world)]
    dist.all_gather(everyone, sizes)
    shapes = [s.cpu().tolist() for s in everyone]  # [rank][tensor] -> [rows, width]
    gathered = {}
    for index, name in enumerate(names):
        tensor = tensors[name]
        rows = max(shape[index][0] for shape in shapes)
        width = max(shape[index][1] for shape in shapes)
        padded = torch.zeros((rows, width) if tensor.dim() == 2 else (rows,), dtype=tensor.dtype, device=device)
        padded[tuple(slice(0, n) for n in tensor.shape)] = tensor.to(device)
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        gathered[name] = torch.cat([part[:shape[index][0]] for part, shape in zip(parts, shapes, strict=True)]).cpu()
    return gathered
