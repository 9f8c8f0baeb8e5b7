"""Each rank's micro-batches of one of SFT's global batches (``engine.offline.epochs``: the run's batches).

Each global batch is planned over the ranks by ``engine.packing`` (micro-batches within
``train.micro_batch_tokens``, packed in one row or padded, ranks balanced by tokens). The loss of a micro-batch is
its mean over its supervised tokens, weighted by their count (``FSDPEngine.forward_backward_batch``): the step's loss
and gradients are the sum over the supervised tokens of the whole global batch divided by their number, however the
batch is split.
"""

from __future__ import annotations

from ....packing import plan_micro_batches
from ...masks import Tokenized
from ...sequences import MicroBatch, micro_batch, sequence_batch


def rank_micro_batches(items: list[Tokenized], rank: int, world_size: int, *, micro_batch_tokens: int | None,
                       micro_batch_size: int, packed: bool) -> tuple[list[MicroBatch], dict]:
    """This rank's micro-batches of a global batch, and the plan's figures (same on every rank)."""
    batch, masks = sequence_batch(items)
    plan = plan_micro_batches(batch.lengths.tolist(), world_size, max_tokens=micro_batch_tokens,
                              max_sequences=None if micro_batch_tokens else micro_batch_size, padded=not packed)
    micro_batches: list[MicroBatch] = [micro_batch(batch, masks, indices, packed) for indices in plan.ranks[rank]]
    pad_tokens = sum(micro.layout.pad_tokens for micro in micro_batches)
    figures = {"micro_batches": float(plan.micro_batches), "token_imbalance": plan.imbalance,
               "pad_tokens": float(pad_tokens)}
    return micro_batches, figures
