"""Preference pairs as micro-batches: both sequences of a pair always in the same micro-batch (their loss couples
them), packed in one row with no pad token, or padded; and the per-sequence sums the pair losses read.

A global batch of pairs is planned over the data-parallel ranks by ``engine.packing`` with each pair as one unit:
its load is its two sequences' tokens packed, or two rows of its longer sequence padded, within
``train.micro_batch_tokens`` (or ``train.micro_batch_size`` pairs). A micro-batch's sequences are its pairs' chosen
and rejected in turn (``[c0, r0, c1, r1, ...]``), so sequence ``2 i`` is pair ``i``'s chosen and ``2 i + 1`` its
rejected.

With sequence parallelism each rank of a group holds a slice of every sequence's tokens: ``group_total`` adds the
ranks' partial sums into the whole sequence's, in a form whose gradient reaches every rank's own tokens exactly
once, so a pair loss computed from them on each rank (and divided by the group's size, as every loss share is) has
the gradient of the unsplit micro-batch.
"""

from __future__ import annotations

import dataclasses

import torch

from ..packing import plan_micro_batches
from ..sequence_parallel import split_layout
from .pairs import TokenizedPair
from .sequences import MicroBatch, micro_batch, sequence_batch
from .step import Objective


@dataclasses.dataclass
class PairMicroBatch:
    micro: MicroBatch  # the sequences [c0, r0, c1, r1, ...] of its pairs
    pairs: tuple[int, ...]  # indices into the global batch
    margins: torch.Tensor  # [pairs] (zeros when the data has none)
    reference: torch.Tensor | None = None  # [2 * pairs] sequence log-probs under a frozen model, when computed

    @property
    def layout(self):
        return self.micro.layout

    @property
    def mask(self) -> torch.Tensor:
        return self.micro.mask


def pair_loads(pairs: list[TokenizedPair], packed: bool) -> list[int]:
    """What each pair costs a micro-batch: its tokens packed, two rows of its longer sequence padded."""
    if packed:
        return [pair.tokens for pair in pairs]
    return [2 * max(len(pair.chosen.ids), len(pair.rejected.ids)) for pair in pairs]


def rank_pair_micro_batches(pairs: list[TokenizedPair], rank: int, world_size: int, *, micro_batch_tokens: int | None,
                            micro_batch_size: int, packed: bool) -> tuple[list[PairMicroBatch], dict]:
    """This (data-parallel) rank's micro-batches of a global batch of pairs, and the plan's figures (the same on
    every rank)."""
    batch, masks = sequence_batch([side for pair in pairs for side in (pair.chosen, pair.rejected)])
    plan = plan_micro_batches(pair_loads(pairs, packed), world_size, max_tokens=micro_batch_tokens,
                              max_sequences=None if micro_batch_tokens else micro_batch_size, padded=not packed)
    micro_batches = []
    for chosen_pairs in plan.ranks[rank]:
        sequences = [index for pair in chosen_pairs for index in (2 * pair, 2 * pair + 1)]
        margins = torch.tensor([pairs[i].margin or 0.0 for i in chosen_pairs], dtype=torch.float32)
        micro_batches.append(PairMicroBatch(micro_batch(batch, masks, sequences, packed), tuple(chosen_pairs),
                                            margins))
    figures = {"micro_batches": float(plan.micro_batches), "token_imbalance": plan.imbalance,
               "pad_tokens": float(sum(m.layout.pad_tokens for m in micro_batches))}
    return micro_batches, figures


def rank_share(micro, sp, device) -> tuple[object, torch.Tensor]:
    """``(layout, mask)`` of this rank's part of ``micro`` on ``device``: its slice and its own tokens' mask with a
    sequence-parallel group ``sp`` (a rank owning no scored token keeps one stand-in, masked out), else the whole
    micro-batch."""
    layout, mask = micro.layout, micro.mask
    if sp is not None and sp.enabled:
        layout = split_layout(layout, sp)
        mask = mask[layout.owned] if layout.owned.numel() else torch.zeros(1)
    return layout.to(device), mask.to(device)


def sequence_sums(values: torch.Tensor, layout, count: int) -> torch.Tensor:
    """Per-token ``values`` ``[T]`` (in the layout's target order, masked by the caller) summed per sequence:
    ``[count]``. On a sequence-parallel slice only the rank's own tokens are in ``values``."""
    rows = layout.rows.to(values.device)
    return values.new_zeros(count).index_add(0, rows, values)


def group_total(partial: torch.Tensor, sp) -> torch.Tensor:
    """The sum over the sequence-parallel group of each rank's ``partial`` (``[n]``, differentiable).

    The value is the group's sum; its gradient is ``sp.size`` times that of this rank's own part, so that a loss of
    it divided by ``sp.size`` on each rank (the group's shares add up to the loss) sends each rank's tokens the
    whole gradient of the unsplit loss, with no collective in the backward pass. Without a group: ``partial``.
    """
    if not sp.enabled:
        return partial
    own = partial.detach()
    return sp.group_sum(own, own.device) + sp.size * (partial - own)


def chosen_and_rejected(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence values ``[2 P]`` of a pair micro-batch as ``(chosen [P], rejected [P])``."""
    return values[0::2], values[1::2]


class PairObjective(Objective):
    """The data shape of an objective on preference pairs (DPO, reward models): a pair's two sequences in one
    micro-batch, each micro-batch weighted by its pairs (the step's loss is the mean over the global batch's)."""

    weight = "pairs"

    def micro_batches(self, items, rank, world_size, *, micro_batch_tokens, micro_batch_size, packed):
        return rank_pair_micro_batches(items, rank, world_size, micro_batch_tokens=micro_batch_tokens,
                                       micro_batch_size=micro_batch_size, packed=packed)

    def lengths(self, items):
        return [len(side.ids) for pair in items for side in (pair.chosen, pair.rejected)]

    def counts(self, items, weight, elapsed):
        tokens = float(sum(pair.tokens for pair in items))
        return {"pairs": float(len(items)), "num_tokens": tokens, "tokens_per_s": tokens / elapsed}
