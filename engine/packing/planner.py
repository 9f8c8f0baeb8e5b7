"""The packing planner: which sequences each rank runs together, in how many micro-batches.

Given the lengths of every sequence of one (global) mini-batch, it returns each rank's micro-batches (lists of
sequence indices) such that

* every rank runs the same number of micro-batches (FSDP's collectives pair them up across ranks),
* every micro-batch stays within the limits (a token budget and/or a number of sequences),
* the ranks' loads are balanced (the imbalance, max over mean, is reported),
* the plan is a pure function of its inputs: every rank computes the same plan with no communication.

The load of a micro-batch is what its forward computes: its tokens when packed (one row, no padding), or its rows
times its longest sequence when padded. A padded plan therefore respects the budget in padded tokens, so a budget
bounds memory on either path. Sequences are sorted longest first (ties by index), then:

* packed: "sorted greedy" (longest processing time first). Each sequence goes into the micro-batch with the least
  load that can still take it, over ``world_size x k`` micro-batches, ``k`` starting at its lower bound (the total
  load over the budget of all ranks) and raised by one while a sequence finds no room. Greedy into a fixed number
  of bins balances the bins themselves;
* padded: consecutive runs of the sorted order (similar lengths together, so little padding), each as long as the
  limits allow; then the heaviest runs are halved until every rank can have the same number ``k``.

Either way the ranks then get ``k`` micro-batches each, the heaviest first to the rank with the least load so
far, which balances their loads. ``docs/engine.md`` has the measured balance and padding.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence


class SequenceTooLong(ValueError):
    """A sequence is longer than the token budget of a micro-batch (it could never run)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Each rank's micro-batches: ``ranks[rank][i]`` lists the sequence indices of its ``i``-th micro-batch."""

    ranks: tuple[tuple[tuple[int, ...], ...], ...]
    loads: tuple[int, ...]  # per rank: tokens its forwards compute (packed: real tokens; padded: rows x longest)
    padded: bool

    @property
    def micro_batches(self) -> int:
        """Micro-batches per rank (the same on every rank)."""
        return len(self.ranks[0])

    @property
    def non_empty(self) -> int:
        """Micro-batches holding at least one sequence, over all ranks."""
        return sum(1 for rank in self.ranks for micro in rank if micro)

    @property
    def imbalance(self) -> float:
        """The busiest rank's load over the mean load (1.0: perfectly balanced)."""
        mean = sum(self.loads) / len(self.loads)
        return max(self.loads) / mean if mean else 1.0


def micro_batch_load(lengths: Sequence[int], padded: bool) -> int:
    """Tokens one forward computes for these sequences: their sum packed, rows x longest padded."""
    if not lengths:
        return 0
    return len(lengths) * max(lengths) if padded else sum(lengths)


def plan_micro_batches(lengths: Sequence[int], world_size: int, *, max_tokens: int | None = None,
                       max_sequences: int | None = None, padded: bool = False) -> Plan:
    """Plan one mini-batch of sequences of ``lengths`` over ``world_size`` ranks (see the module docstring).

    ``max_tokens`` bounds each micro-batch's load (its tokens packed, rows x longest padded); ``max_sequences`` its
    number of sequences. At least one of them must be given. A sequence longer than ``max_tokens`` raises
    ``SequenceTooLong`` naming both numbers. With fewer sequences than micro-batches some are empty (``()``): the
    rank still runs them, as FSDP needs, on a filler that weighs nothing.
    """
    lengths = [int(n) for n in lengths]
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if max_tokens is None and max_sequences is None:
        raise ValueError("give max_tokens (a token budget) or max_sequences (sequences per micro-batch), or both")
    if (max_tokens is not None and max_tokens < 1) or (max_sequences is not None and max_sequences < 1):
        raise ValueError(f"limits must be positive, got max_tokens={max_tokens}, max_sequences={max_sequences}")
    if any(n < 1 for n in lengths):
        raise ValueError("every sequence needs at least one token")
    if max_tokens is not None and lengths and max(lengths) > max_tokens:
        longest = max(lengths)
        raise SequenceTooLong(f"a sequence of {longest} tokens does not fit the micro-batch token budget of "
                              f"{max_tokens}: raise the budget to at least {longest} or shorten the sequences")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if padded:
        bins = _sorted_runs(order, lengths, world_size, max_tokens, max_sequences)
        return _assign(bins, lengths, world_size, len(bins) // world_size, padded)
    per_rank = _lower_bound(lengths, world_size, max_tokens, max_sequences)
    while True:
        bins = _greedy(order, lengths, world_size * per_rank, max_tokens, max_sequences)
        if bins is not None:
            break
        per_rank += 1  # terminates: with a micro-batch per sequence every sequence fits alone
    return _assign(bins, lengths, world_size, per_rank, padded)


def _lower_bound(lengths: list[int], world_size: int, max_tokens: int | None, max_sequences: int | None) -> int:
    needed = 1
    if max_tokens is not None:
        needed = max(needed, math.ceil(sum(lengths) / (world_size * max_tokens)))
    if max_sequences is not None:
        needed = max(needed, math.ceil(len(lengths) / (world_size * max_sequences)))
    return needed


def _greedy(order: list[int], lengths: list[int], count: int, max_tokens: int | None,
            max_sequences: int | None) -> list[list[int]] | None:
    """Each sequence (longest first) into the least-loaded of ``count`` packed micro-batches that can take it.

    A heap keyed by (load, index) finds it; a micro-batch full by count leaves the heap. When the least-loaded one
    cannot take a sequence by tokens, none can (it has the most room): ``None`` asks for more micro-batches.
    """
    bins: list[list[int]] = [[] for _ in range(count)]
    heap = [(0, index) for index in range(count)]
    for item in order:
        while True:
            if not heap:
                return None
            load, index = heap[0]
            if max_sequences is not None and len(bins[index]) >= max_sequences:
                heapq.heappop(heap)
                continue
            if max_tokens is not None and load + lengths[item] > max_tokens:
                return None
            bins[index].append(item)
            heapq.heapreplace(heap, (load + lengths[item], index))
            break
    return bins


def _sorted_runs(order: list[int], lengths: list[int], world_size: int, max_tokens: int | None,
                 max_sequences: int | None) -> list[list[int]]:
    """Padded micro-batches: the sorted order cut into runs as long as the limits allow (a run's longest is its
    first), then the heaviest runs halved until there are ``world_size x k`` of them (or empty ones added when too
    few sequences are left to split)."""
    runs: list[list[int]] = []
    for item in order:
        run = runs[-1] if runs else None
        if run is None or (max_sequences is not None and len(run) >= max_sequences) or (
                max_tokens is not None and (len(run) + 1) * lengths[run[0]] > max_tokens):
            runs.append([item])
        else:
            run.append(item)
    wanted = world_size * max(1, math.ceil(len(runs) / world_size))
    while len(runs) < wanted:
        splittable = [r for r in range(len(runs)) if len(runs[r]) > 1]
        if not splittable:
            runs.append([])
            continue
        heaviest = max(splittable, key=lambda r: (micro_batch_load([lengths[i] for i in runs[r]], True), -r))
        run = runs[heaviest]
        runs[heaviest:heaviest + 1] = [run[:len(run) // 2], run[len(run) // 2:]]
    return runs


def _assign(bins: list[list[int]], lengths: list[int], world_size: int, per_rank: int, padded: bool) -> Plan:
    """Give each rank ``per_rank`` micro-batches, the heaviest first to the rank with the least load so far."""
    loads = [micro_batch_load([lengths[i] for i in members], padded) for members in bins]
    ranks: list[list[tuple[int, ...]]] = [[] for _ in range(world_size)]
    rank_loads = [0] * world_size
    for index in sorted(range(len(bins)), key=lambda b: (-loads[b], b)):
        open_ranks = [r for r in range(world_size) if len(ranks[r]) < per_rank]
        rank = min(open_ranks, key=lambda r: (rank_loads[r], r))
        ranks[rank].append(tuple(bins[index]))
        rank_loads[rank] += loads[index]
    return Plan(ranks=tuple(tuple(r) for r in ranks), loads=tuple(rank_loads), padded=padded)
