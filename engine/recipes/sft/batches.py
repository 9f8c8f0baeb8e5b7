"""The global batches of a run and each rank's micro-batches of one.

A run's optimizer steps are fixed before training from the examples' lengths alone: the examples in a seeded
order (a new permutation each epoch, epochs end to end), cut into global batches of ``train.batch_size`` sequences
(or as many as fit ``train.batch_tokens``). Every rank computes the same list, whatever the world size, so 1 and 2
ranks train on the same batches, and a resumed run continues at exactly the batch an uninterrupted one would.

Each global batch is then planned over the ranks by ``engine.packing`` (micro-batches within
``train.micro_batch_tokens``, packed in one row or padded, ranks balanced by tokens). The loss of a micro-batch is
its mean over its supervised tokens, weighted by their count (``FSDPEngine.forward_backward_batch``): the step's loss
and gradients are the sum over the supervised tokens of the whole global batch divided by their number, however the
batch is split.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ...packing import SequenceBatch, build_layout, plan_micro_batches
from .masks import Tokenized


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
    budget = math.inf if steps is not None else epochs * count  # sequences to consume
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


@dataclasses.dataclass
class MicroBatch:
    layout: object  # engine.packing.Layout
    mask: torch.Tensor  # [T] float: 1 where the layout's target token is supervised


def sequence_batch(items: list[Tokenized]) -> tuple[SequenceBatch, torch.Tensor]:
    """The items right-padded, each scored from its first supervised token (>= 1), and their masks ``[N, W]``."""
    width = max(len(item.ids) for item in items)
    tokens = torch.zeros(len(items), width, dtype=torch.long)
    masks = torch.zeros(len(items), width, dtype=torch.float32)
    starts = []
    for row, item in enumerate(items):
        tokens[row, :len(item.ids)] = torch.tensor(item.ids)
        masks[row, :len(item.mask)] = torch.tensor(item.mask, dtype=torch.float32)
        masks[row, 0] = 0.0
        starts.append(next(i for i, m in enumerate(item.mask) if m and i))
    lengths = torch.tensor([len(item.ids) for item in items], dtype=torch.long)
    return SequenceBatch(tokens, lengths, torch.tensor(starts, dtype=torch.long)), masks


def rank_micro_batches(items: list[Tokenized], rank: int, world_size: int, *, micro_batch_tokens: int | None,
                       micro_batch_size: int, packed: bool) -> tuple[list[MicroBatch], dict]:
    """This rank's micro-batches of a global batch, and the plan's figures (same on every rank)."""
    batch, masks = sequence_batch(items)
    plan = plan_micro_batches(batch.lengths.tolist(), world_size, max_tokens=micro_batch_tokens,
                              max_sequences=None if micro_batch_tokens else micro_batch_size, padded=not packed)
    micro_batches = []
    pad_tokens = 0
    for indices in plan.ranks[rank]:
        layout = build_layout(batch, indices, packed)
        if layout.filler:
            mask = torch.zeros(len(layout.targets))
        else:
            chosen = torch.tensor(indices, dtype=torch.long)[layout.rows]
            mask = masks[chosen, batch.starts[chosen] + layout.columns]
        pad_tokens += layout.pad_tokens
        micro_batches.append(MicroBatch(layout, mask))
    figures = {"micro_batches": float(plan.micro_batches), "token_imbalance": plan.imbalance,
               "pad_tokens": float(pad_tokens)}
    return micro_batches, figures
