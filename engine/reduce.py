"""Sum named metrics over ranks, after the ranks have agreed on the names.

Packing metrics into one tensor and all-reducing it is cheap, but only correct when every rank packs the same keys
in the same order: a metric logged on one rank only (present when some condition holds) would otherwise be added to
a different metric, or, with a different count of keys, leave the ranks waiting on each other. So the key sets are
compared first (one all-reduce of a fixed-size fingerprint, and only on a mismatch a gather of the names, to say
which rank lacks which key), then the values are summed in sorted key order: two small all-reduces in all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
import torch.distributed as dist


class MetricKeysMismatch(RuntimeError):
    """Ranks tried to reduce different metric names; the message names the rank and the keys."""


def _fingerprint(keys: list[str], device: torch.device) -> torch.Tensor:
    digest = hashlib.sha256("\0".join(keys).encode()).digest()[:7]  # 56 bits fit an int64 exactly
    return torch.tensor([int.from_bytes(digest, "little"), len(keys)], dtype=torch.int64, device=device)


def _check_same_keys(keys: list[str], device: torch.device, group=None) -> None:
    world = dist.get_world_size(group)
    if world == 1:
        return
    mine = _fingerprint(keys, device)
    extremes = torch.cat([mine, -mine])
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)  # the largest and (negated) the smallest of each entry
    if torch.equal(extremes[:2], -extremes[2:]):
        return
    names: list[list[str] | None] = [None] * world
    dist.all_gather_object(names, keys, group=group)
    union = sorted(set().union(*names))
    problems = []
    for rank, rank_keys in enumerate(names):
        missing = [k for k in union if k not in rank_keys]
        if missing:
            problems.append(f"rank {rank} lacks {', '.join(repr(k) for k in missing)}")
    raise MetricKeysMismatch(
        "ranks reduce different metrics: " + "; ".join(problems)
        + ". Log every metric on every rank (use 0.0 with a count, or always include the key).")


def sum_over_ranks(values: Mapping[str, torch.Tensor | float], device: torch.device, group=None,
                   dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """``{key: sum over ranks}``; every rank must pass the same keys (else ``MetricKeysMismatch`` on every rank).

    Two all-reduces whatever the number of keys: a fixed-size key fingerprint, then the packed values.
    """
    keys = sorted(values)
    _check_same_keys(keys, device, group)
    if not keys:
        return {}
    packed = torch.stack([torch.as_tensor(values[k], dtype=dtype, device=device).reshape(()) for k in keys])
    dist.all_reduce(packed, group=group)
    return dict(zip(keys, packed.tolist()))
