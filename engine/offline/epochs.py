"""A run's global batches over a fixed data set (SFT's examples, DPO's and a reward model's pairs).

A run's optimizer steps are fixed before training from the items' lengths alone: the items in a seeded order (a
new permutation each epoch, epochs end to end), cut into global batches of ``batch_size`` items (or as many as fit
``batch_tokens``). Every rank computes the same list, whatever the world size, so 1 and 2 ranks train on the same
batches, and a resumed run continues at exactly the batch an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class GlobalBatch:
    indices: tuple[int, ...]  # into the training set
    epoch: float  # epochs completed after this batch


def _order(count: int, seed: int, epoch: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(count, generator=generator).tolist()


def schedule(lengths: list[int], *, batch_size: int, batch_tokens: int | None, epochs: float, steps: int | None,
             seed: int) -> list[GlobalBatch]:
    """Every optimizer step's batch: ``steps`` of them, or as many as ``epochs`` passes over the data make (a
    last partial batch is dropped, as every step takes a full batch)."""
    count = len(lengths)
    limit = steps if steps is not None else math.inf
    budget = math.inf if steps is not None else epochs * count  # items to consume
    batches: list[GlobalBatch] = []
    epoch, order, position, consumed = 0, _order(count, seed, 0), 0, 0
    while len(batches) < limit:
        members, tokens = [], 0
        while True:
            if position == count:
                epoch, position = epoch + 1, 0
                order = _order(count, seed, epoch)
            index = order[position]
            if batch_tokens is None:
                if len(members) == batch_size:
                    break
            elif members and tokens + lengths[index] > batch_tokens:
                break
            members.append(index)
            tokens += lengths[index]
            position += 1
        if consumed + len(members) > budget and batches:
            break
        consumed += len(members)
        batches.append(GlobalBatch(tuple(members), consumed / count))
        if consumed >= budget:
            break
    return batches
