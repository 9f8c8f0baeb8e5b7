"""Sum named metrics over ranks, after the ranks have agreed on the names: one all-reduce in the common case.

Packing metrics into one tensor and all-reducing it is cheap, but only correct when every rank packs the same keys
in the same order: a metric logged on one rank only (present when some condition holds) would otherwise be added to
a different metric, or, with a different count of keys, leave the ranks waiting on each other. So every rank sends
a fixed-size tensor: a fingerprint of its sorted key names, then (up to ``VALUE_SLOTS`` of them) its values. The
fingerprint is a few small integers ``h`` sent with their squares: from the sums every rank receives alike, all ranks
sent the same ``h`` exactly when ``world * sum(h*h) == sum(h)**2`` (zero variance), so every rank reaches the same
verdict. On a mismatch the names are gathered to say which rank lacks which key; more keys than slots take a second
all-reduce for the values. The all-reduce can be started early (``start_sum_over_ranks``) and waited for later.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
import torch.distributed as dist

HASHES = 4  # 13-bit pieces of the key fingerprint: 52 bits in all
HASH_BITS = 13  # world * sum(h*h) stays an exact float64 integer up to 2**13 ranks
MAX_EXACT_WORLD = 2 ** HASH_BITS
PACKED_SLOTS = 64  # the fixed size every rank sends
VALUE_SLOTS = PACKED_SLOTS - 2 * HASHES


class MetricKeysMismatch(RuntimeError):
    """Ranks tried to reduce different metric names; the message names the rank and the keys."""


def _fingerprint(keys: list[str]) -> list[float]:
    digest = int.from_bytes(hashlib.sha256("\0".join(keys).encode()).digest()[:8], "little")
    pieces = [float((digest >> (HASH_BITS * i)) & (MAX_EXACT_WORLD - 1)) for i in range(HASHES)]
    return pieces + [h * h for h in pieces]


def _same_everywhere(summed_header: list[float], world: int) -> bool:
    sums, squares = summed_header[:HASHES], summed_header[HASHES:]
    return all(world * sq == s * s for s, sq in zip(sums, squares, strict=True))


def _raise_mismatch(keys: list[str], group) -> None:
    names: list[list[str] | None] = [None] * dist.get_world_size(group)
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


def _stack(values: Mapping, keys: list[str], device: torch.device) -> torch.Tensor:
    return torch.stack([torch.as_tensor(values[k], dtype=torch.float64, device=device).reshape(()) for k in keys])


def sum_over_ranks(values: Mapping[str, torch.Tensor | float], device: torch.device,
                   group=None) -> dict[str, float]:
    """``{key: sum over ranks}`` (summed in float64); every rank must pass the same keys (else
    ``MetricKeysMismatch`` on every rank). One all-reduce for up to ``VALUE_SLOTS`` keys, two beyond.
    """
    return start_sum_over_ranks(values, device, group).result()


class PendingSum:
    """A ``sum_over_ranks`` under way: the all-reduce runs while the caller works on; ``result()`` waits for it."""

    def __init__(self, keys: list[str], values: Mapping, device: torch.device, group) -> None:
        self.keys, self.values, self.device, self.group = keys, values, device, group
        self.world = dist.get_world_size(group)
        self.inline = len(keys) <= VALUE_SLOTS
        self.packed, self.work = None, None
        if 1 < self.world <= MAX_EXACT_WORLD:
            packed = torch.zeros(PACKED_SLOTS, dtype=torch.float64, device=device)
            packed[:2 * HASHES] = torch.tensor(_fingerprint(keys), dtype=torch.float64)
            if self.inline and keys:
                packed[2 * HASHES:2 * HASHES + len(keys)] = _stack(values, keys, device)
            self.packed, self.work = packed, dist.all_reduce(packed, group=group, async_op=True)

    def result(self) -> dict[str, float]:
        keys, values, device, group = self.keys, self.values, self.device, self.group
        if self.world == 1:
            return {k: float(torch.as_tensor(values[k]).item()) for k in keys}
        if self.work is None:  # the fingerprint's sums would no longer be exact: compare it on its own
            return _sum_in_two_steps(values, keys, device, group)
        self.work.wait()
        summed = self.packed.tolist()
        if not _same_everywhere(summed[:2 * HASHES], self.world):
            _raise_mismatch(keys, group)
        if self.inline:
            return dict(zip(keys, summed[2 * HASHES:], strict=False))
        stacked = _stack(values, keys, device)
        dist.all_reduce(stacked, group=group)
        return dict(zip(keys, stacked.tolist(), strict=True))


def start_sum_over_ranks(values: Mapping[str, torch.Tensor | float], device: torch.device,
                         group=None) -> PendingSum:
    """Start ``sum_over_ranks``; ``.result()`` returns what it would (the engine overlaps it with a backward)."""
    return PendingSum(sorted(values), values, device, group)


def _sum_in_two_steps(values, keys, device, group) -> dict[str, float]:
    """Key check by MAX of the fingerprint and its negation (exact at any world size), then the values."""
    mine = torch.tensor([float(h) for h in _fingerprint(keys)[:HASHES]], dtype=torch.float64, device=device)
    extremes = torch.cat([mine, -mine])
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
    if not torch.equal(extremes[:HASHES], -extremes[HASHES:]):
        _raise_mismatch(keys, group)
    if not keys:
        return {}
    stacked = _stack(values, keys, device)
    dist.all_reduce(stacked, group=group)
    return dict(zip(keys, stacked.tolist(), strict=True))
