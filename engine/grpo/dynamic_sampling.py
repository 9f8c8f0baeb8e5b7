"""DAPO's dynamic sampling (``algorithm.filter_groups``): a group whose rewards are all equal has advantages of 0
and teaches nothing, so it is dropped and more prompts are drawn until each rank holds its share of groups with
a learning signal, or ``algorithm.max_gen_batches`` draws were made.

Every draw generates with the sharded model, and sharded forwards are collectives: every rank must make the same
number of draws. So whether to draw again is decided together (one all-reduce per draw): all ranks keep drawing
until every rank is full. A rank that is already full still draws (its new groups are not used). When the draws
run out first, every rank trains on the same number of groups, the smallest number any rank kept (the others'
surplus is left out), and at least one group: a rank that kept none takes a dropped one (advantages of 0).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from .scoring import ScoredRollout, concat, select_groups


def informative_groups(group_rewards: torch.Tensor) -> list[int]:
    """Indices of the groups (rows of ``[groups, n]``) whose rewards are not all equal."""
    spread = group_rewards.max(dim=1).values - group_rewards.min(dim=1).values
    return [index for index, value in enumerate(spread.tolist()) if value > 0]


@dataclasses.dataclass
class SamplingResult:
    batch: ScoredRollout  # what this rank trains on
    drawn: list[ScoredRollout]  # every draw, for the metrics (they all come from the current policy)
    draws: int
    groups_drawn: int
    groups_kept: int  # groups with a learning signal in ``batch``
    groups_filtered: int  # groups dropped for equal rewards
    full: bool  # every rank found its share before the draws ran out

    def metrics(self) -> dict[str, float]:
        """Per-rank figures, to be summed over ranks (``sampling/draws`` is the same on every rank)."""
        return {"sampling/groups_drawn": float(self.groups_drawn), "sampling/groups_kept": float(self.groups_kept),
                "sampling/groups_filtered": float(self.groups_filtered), "sampling/draws": float(self.draws),
                "sampling/batch_full": float(self.full)}


def fill_batch(draw: Callable[[], ScoredRollout], *, groups_wanted: int, max_draws: int,
               min_over_ranks: Callable[[list[float]], list[float]], pad_token_id: int) -> SamplingResult:
    """Call ``draw()`` (generate and score one batch of prompts) until every rank holds ``groups_wanted`` groups
    with unequal rewards, or ``max_draws`` draws were made.

    ``min_over_ranks(values)`` returns the element-wise minimum of ``values`` over all ranks (an all-reduce; the
    identity on one rank). Every rank makes the same draws and calls, so none waits for a collective alone.
    """
    kept: list[tuple[ScoredRollout, int]] = []
    dropped: list[tuple[ScoredRollout, int]] = []
    drawn: list[ScoredRollout] = []
    while True:
        scored = draw()
        drawn.append(scored)
        good = set(informative_groups(scored.group_rewards()))
        for group in range(len(scored.samples)):
            (kept if group in good else dropped).append((scored, group))
        everyone_full, fewest_kept = min_over_ranks([float(len(kept) >= groups_wanted), float(len(kept))])
        if everyone_full or len(drawn) >= max_draws:
            break
    count = min(groups_wanted, int(fewest_kept))
    chosen = kept[:count] if count else (kept or dropped)[:1]
    kept_in_batch = count if count else int(bool(kept))
    parts = [select_groups(scored, [g for s, g in chosen if s is scored]) for scored in drawn
             if any(s is scored for s, _ in chosen)]
    return SamplingResult(batch=concat(parts, pad_token_id), drawn=drawn, draws=len(drawn),
                          groups_drawn=sum(len(s.samples) for s in drawn), groups_kept=kept_in_batch,
                          groups_filtered=len(dropped), full=bool(everyone_full))


def summary(totals: dict[str, float], world_size: int) -> dict[str, float]:
    """The ``sampling/*`` metrics of a step from ``SamplingResult.metrics()`` summed over ranks; empty without
    dynamic sampling. Groups are counted over all ranks; ``sampling/draws`` per rank (the same on all);
    ``sampling/batch_full`` 0.0 when the draws ran out before every rank had its share."""
    if "sampling/draws" not in totals:
        return {}
    return {"sampling/groups_drawn": totals["sampling/groups_drawn"],
            "sampling/groups_kept": totals["sampling/groups_kept"],
            "sampling/groups_filtered": totals["sampling/groups_filtered"],
            "sampling/draws": totals["sampling/draws"] / world_size,
            "sampling/batch_full": totals["sampling/batch_full"] / world_size}
