"""Which ranks sample together, and each rank's share of a micro-batch's loss, under sequence parallelism.

With ``engine.sequence_parallel_size`` (sp) > 1 the ranks of one group train on slices of the same sequences, so
they must have the same prompts and responses. Every rank of a group rolls out the group's prompts (seeded per
group: sharded generation is a collective, so every rank runs it) and scores them; only the group's first rank
hands its rows to the step's batch and its figures to the step's sums, so every sequence and every count is taken
once, even where two ranks' samples differ (kernels that are not deterministic). Without sp every rank is a group
of one and nothing here changes what it does.

In the update each rank computes log-probs on its slice (``split_layout``): ``MicroBatchShare`` gives the losses
the rank's own loss tokens, the whole micro-batch's tokens to count (every normaliser: each token once), and the
sum over the group that GSPO's sequence ratio and the sequence-level rollout corrections need.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from ..sequence_parallel import split_layout


@dataclasses.dataclass(frozen=True)
class SamplingGroups:
    """This rank's data-parallel group (``engine.sequence_parallel``) as the sampler sees it."""

    sp: object  # engine.sequence_parallel.SequenceParallel
    device: torch.device  # where the backend's collectives take tensors

    @property
    def rank(self) -> int:
        """The group's index: which prompts it draws, which micro-batches it gets."""
        return self.sp.data_parallel_rank

    @property
    def size(self) -> int:
        return self.sp.data_parallel_size

    @property
    def leader(self) -> bool:
        """The group's first rank: its rows and figures are the group's."""
        return self.sp.rank == 0

    def once(self, sums: dict[str, float]) -> dict[str, float]:
        """``sums`` to add over ranks, counted once per group (the leader's; zeros from the others)."""
        return sums if self.leader else {key: 0.0 for key in sums}

    def counts(self, count: int) -> list[int]:
        """Every group's ``count`` in group order: one all-gather over the ranks, the leaders' values taken."""
        mine = torch.tensor([count], dtype=torch.long, device=self.device)
        everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, mine)
        return [int(t.item()) for t in everyone[::self.sp.size]]

    def sum_rows(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` [N] over the step's sequences, each group giving its own rows (zeros elsewhere), summed over
        the groups: every sequence's value on every rank (one all-reduce; the leaders' values count)."""
        mine = (values if self.leader else torch.zeros_like(values)).to(self.device, torch.float32)
        dist.all_reduce(mine)
        return mine.cpu()


@dataclasses.dataclass
class MicroBatchShare:
    """One rank's part of a micro-batch: its slice (the whole layout without sp), its own loss tokens ``mask``
    ``[n, R]``, the whole micro-batch's ``counts`` and ``across`` (a sum over the group; None without sp)."""

    layout: object
    mask: torch.Tensor
    counts: torch.Tensor
    across: object = None
    sp: object = None

    @classmethod
    def of(cls, micro, sp, device) -> MicroBatchShare:
        counts = micro.loss_mask.to(device)
        if not sp.enabled:
            return cls(micro.layout.to(device), counts, counts)
        piece = split_layout(micro.layout, sp)
        return cls(piece.to(device), counts * piece.scored_mask.to(device), counts,
                   lambda value: sp.group_sum(value, value.device), sp)

    def counted_sequences(self) -> torch.Tensor | None:
        """The sequences whose per-sequence figures this rank counts: all with a loss token on the group's first
        rank, none on the others (None without sp: those with a loss token of this rank's)."""
        if self.sp is None:
            return None
        return self.counts.bool().any(dim=-1) & (self.sp.rank == 0)


def rank_values(values: torch.Tensor, piece) -> torch.Tensor:
    """Per-sequence values ``[n, R]`` of a slice with zeros at every token the rank does not own (a rank without
    one computed a stand-in): a sum over the group gives the whole micro-batch's."""
    return values * piece.scored_mask.to(values.device, values.dtype)
