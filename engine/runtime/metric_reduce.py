"""Sum (or take the maximum of) named metrics over ranks, after the ranks have agreed on the names, in dtypes every
device's collectives reduce: int64 and float32 (HCCL reduces no float64 before Ascend950, even in a group of one).

Packing metrics into a tensor and all-reducing it is cheap, but only correct when every rank packs the same keys
in the same order: a metric logged on one rank only would otherwise be added to a different metric, or, with a
different count of keys, leave the ranks waiting on each other. So every rank sends fixed-size tensors: a
fingerprint of its sorted key names, then (up to ``VALUE_SLOTS`` of them) its values. The fingerprint is a few
integers ``h`` sent with their squares (int64): all ranks sent the same ``h`` exactly when ``world * sum(h*h) ==
sum(h)**2`` (zero variance), a verdict every rank reaches alike from the sums. On a mismatch the names are gathered
to say which rank lacks which key; more keys than slots take a second round for the values.

A value travels as its integer part (int64: counts stay exact at any size) and its fraction as float32: on a grid
of ``2**-k``, then of ``2**-2k`` (``k`` chosen from the world size so that both sums over ranks are exact in
float32), then the rest, whose sum rounds at float32's relative precision of something below ``2**-2k``. The sum
equals float64's to about 1e-12 relative plus ``world**3 * 1e-22`` absolute; nothing float64 is computed on the
device. Sums take two all-reduces (int64 and float32) issued together, which ``start_sum_over_ranks`` lets run
while the caller works on. Maxima map each float64 to an int64 whose order is the float's, so one int64
all-reduce gives them exactly.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping

import torch
import torch.distributed as dist

HASHES = 3  # 20-bit pieces of the key fingerprint: 60 bits in all
HASH_BITS = 20  # sum(h*h) over the ranks stays inside int64 up to 2**22 ranks
MAX_EXACT_WORLD = 2 ** 22
PACKED_SLOTS = 64  # the int64 tensor every rank sends (the float32 one carries two slots per value)
VALUE_SLOTS = PACKED_SLOTS - 2 * HASHES
FLOAT32_BITS = 24  # float32 holds every integer up to 2**24 exactly
EXACT_INT = 2 ** 62  # integer parts travel as int64 below this; larger or non-finite values as float32 alone
FRACTION_PARTS = 3  # float32 slots per value: the fraction on a 2**-k grid, on a 2**-2k grid, the rest


class MetricKeysMismatch(RuntimeError):
    """Ranks tried to reduce different metric names; the message names the rank and the keys."""


def _fingerprint(keys: list[str]) -> list[int]:
    digest = int.from_bytes(hashlib.sha256("\0".join(keys).encode()).digest()[:8], "little")
    pieces = [(digest >> (HASH_BITS * i)) & (2 ** HASH_BITS - 1) for i in range(HASHES)]
    return pieces + [h * h for h in pieces]


def _same_everywhere(summed_header: list[int], world: int) -> bool:
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


def grid_bits(world: int) -> int:
    """``k`` such that ``world`` integers of magnitude up to ``2**k`` sum exactly in float32."""
    return max(0, FLOAT32_BITS - (world - 1).bit_length())


def split_on_host(value: float | int, k: int) -> tuple[int, float, float, float]:
    """``(integer part, fraction on the 2**-k grid, then on the 2**-2k grid, the rest)`` of a host number, in float64
    arithmetic, every step exact."""
    if isinstance(value, int) and abs(value) < EXACT_INT:
        return int(value), 0.0, 0.0, 0.0
    value = float(value)
    if not math.isfinite(value) or abs(value) >= EXACT_INT:
        return 0, value, 0.0, 0.0
    whole = math.trunc(value)
    fraction = value - whole
    high = round(fraction * 2 ** k) / 2 ** k
    middle = round((fraction - high) * 2 ** (2 * k)) / 2 ** (2 * k)
    return whole, high, middle, fraction - high - middle


def split_on_device(values: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """``split_on_host`` for a float32 tensor, in float32 and int64 where it lives (every step exact)."""
    finite = values.isfinite() & (values.abs() < EXACT_INT)
    zero = torch.zeros_like(values)
    whole = torch.where(finite, values.trunc(), zero)
    fraction = values - whole
    high = torch.where(finite, torch.round(fraction * 2 ** k) / 2 ** k, values)
    below = torch.where(finite, fraction - high, zero)
    middle = torch.round(below * 2 ** (2 * k)) / 2 ** (2 * k)
    return whole.to(torch.int64), high, middle, below - middle


def _encode(values: Mapping, keys: list[str], device: torch.device, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``keys``' values as ``(int64 [n] integer parts, float32 [3, n] fractions)`` on ``device``.

    Host numbers (and float64 tensors) are split on the host, one copy to the device for all; floating tensors are
    split where they live, in float32; integer tensors are integer parts.
    """
    count = len(keys)
    whole = torch.zeros(count, dtype=torch.int64, device=device)
    parts = torch.zeros(FRACTION_PARTS, count, dtype=torch.float32, device=device)
    host: list[int] = []
    floating: list[int] = []
    integral: list[int] = []
    for index, key in enumerate(keys):
        value = values[key]
        if not torch.is_tensor(value) or value.dtype == torch.float64:
            host.append(index)
        elif value.dtype.is_floating_point:
            floating.append(index)
        else:
            integral.append(index)
    if host:
        rows = [split_on_host(_number(values[keys[i]]), k) for i in host]
        whole[host] = torch.tensor([r[0] for r in rows], dtype=torch.int64).to(device)
        parts[:, host] = torch.tensor([r[1:] for r in rows], dtype=torch.float32).T.to(device)
    if floating:
        stacked = torch.stack([_scalar(values[keys[i]], device).float() for i in floating])
        split = split_on_device(stacked, k)
        whole[floating] = split[0]
        parts[:, floating] = torch.stack(split[1:])
    if integral:
        whole[integral] = torch.stack([_scalar(values[keys[i]], device).to(torch.int64) for i in integral])
    return whole, parts


def _number(value) -> float | int:
    if torch.is_tensor(value):
        return value.item()
    return value if isinstance(value, int) else float(value)


def _scalar(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    return value.detach().reshape(()).to(device)


def _decode(whole: list[int], parts: list[list[float]]) -> list[float]:
    return [n + (high + (middle + rest)) for n, high, middle, rest in zip(whole, *parts, strict=True)]


def sum_over_ranks(values: Mapping[str, torch.Tensor | float], device: torch.device,
                   group=None) -> dict[str, float]:
    """``{key: sum over ranks}`` (exact for integers, float64's sum to ~1e-12 relative otherwise); every rank must
    pass the same keys (else ``MetricKeysMismatch`` on every rank). Two all-reduces issued together for up to
    ``VALUE_SLOTS`` keys, four beyond.
    """
    return start_sum_over_ranks(values, device, group).result()


class PendingSum:
    """A ``sum_over_ranks`` under way: the all-reduces run while the caller works on; ``result()`` waits for them."""

    def __init__(self, keys: list[str], values: Mapping, device: torch.device, group) -> None:
        self.keys, self.values, self.device, self.group = keys, values, device, group
        self.world = dist.get_world_size(group)
        self.inline = len(keys) <= VALUE_SLOTS
        self.whole = self.fractions = None
        self.works: list = []
        if self.world > MAX_EXACT_WORLD:
            raise ValueError(f"sum_over_ranks takes up to {MAX_EXACT_WORLD} ranks, not {self.world}")
        if self.world > 1:
            self.k = grid_bits(self.world)
            whole = torch.zeros(PACKED_SLOTS, dtype=torch.int64, device=device)
            fractions = torch.zeros(FRACTION_PARTS, VALUE_SLOTS, dtype=torch.float32, device=device)
            whole[:2 * HASHES] = torch.tensor(_fingerprint(keys), dtype=torch.int64).to(device)
            if self.inline and keys:
                whole[2 * HASHES:2 * HASHES + len(keys)], fractions[:, :len(keys)] = _encode(values, keys, device,
                                                                                       self.k)
            self.whole, self.fractions = whole, fractions
            self.works = [dist.all_reduce(whole, group=group, async_op=True),
                          dist.all_reduce(fractions, group=group, async_op=True)]

    def result(self) -> dict[str, float]:
        keys, group = self.keys, self.group
        if self.world == 1:
            return {k: float(_number(self.values[k])) for k in keys}
        for work in self.works:
            work.wait()
        whole, fractions = self.whole.tolist(), self.fractions.tolist()
        if not _same_everywhere(whole[:2 * HASHES], self.world):
            _raise_mismatch(keys, group)
        if self.inline:
            count = len(keys)
            return dict(zip(keys, _decode(whole[2 * HASHES:2 * HASHES + count],
                                          [row[:count] for row in fractions]), strict=True))
        more_whole, more_fractions = _encode(self.values, keys, self.device, self.k)
        works = [dist.all_reduce(more_whole, group=group, async_op=True),
                 dist.all_reduce(more_fractions, group=group, async_op=True)]
        for work in works:
            work.wait()
        return dict(zip(keys, _decode(more_whole.tolist(), more_fractions.tolist()), strict=True))


def start_sum_over_ranks(values: Mapping[str, torch.Tensor | float], device: torch.device,
                         group=None) -> PendingSum:
    """Start ``sum_over_ranks``; ``.result()`` returns what it would (the engine overlaps it with a backward)."""
    return PendingSum(sorted(values), values, device, group)


def ordered_int(value: float) -> int:
    """An int64 whose order is the float64's (NaN above everything); ``ordered_int`` is its own inverse map."""
    bits = struct.unpack("<q", struct.pack("<d", value))[0]
    return bits if bits >= 0 else bits ^ 0x7FFF_FFFF_FFFF_FFFF


def from_ordered_int(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits if bits >= 0 else bits ^ 0x7FFF_FFFF_FFFF_FFFF))[0]


def max_over_ranks(values: Mapping[str, float], device: torch.device, group=None) -> dict[str, float]:
    """``{key: largest over ranks}``, exact (one int64 all-reduce up to ``VALUE_SLOTS`` keys); every rank must pass
    the same keys (else ``MetricKeysMismatch`` on every rank: the fingerprint travels with its negation, so the
    ranks agree exactly when its maximum is minus the maximum of the negation)."""
    keys = sorted(values)
    if dist.get_world_size(group) == 1:
        return {k: float(values[k]) for k in keys}
    pieces = _fingerprint(keys)[:HASHES]
    mine = [ordered_int(float(values[k])) for k in keys]
    head = pieces + [-h for h in pieces]
    packed = torch.zeros(PACKED_SLOTS, dtype=torch.int64)
    packed[:2 * HASHES] = torch.tensor(head, dtype=torch.int64)
    inline = len(keys) <= VALUE_SLOTS
    if inline:
        packed[2 * HASHES:2 * HASHES + len(keys)] = torch.tensor(mine, dtype=torch.int64)
    packed = packed.to(device)
    dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=group)
    largest = packed.tolist()
    if largest[:HASHES] != [-h for h in largest[HASHES:2 * HASHES]]:
        _raise_mismatch(keys, group)
    if not inline:
        rest = torch.tensor(mine, dtype=torch.int64).to(device)
        dist.all_reduce(rest, op=dist.ReduceOp.MAX, group=group)
        largest = [0] * 2 * HASHES + rest.tolist()
    return {k: from_ordered_int(v) for k, v in zip(keys, largest[2 * HASHES:], strict=False)}
