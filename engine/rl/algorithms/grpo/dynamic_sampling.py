"""DAPO's dynamic sampling (``algorithm.filter_groups``): a group whose rewards are all equal has advantages of 0
and teaches nothing, so it is dropped and more prompts are drawn until the ranks together hold the step's
``train.prompts_per_step`` groups with a learning signal, or ``algorithm.max_gen_batches`` draws were made (then
the step trains on the groups it has, and ``sampling/batch_full`` says so).

Every draw generates with the sharded model, and sharded forwards are collectives: every rank must make the same
number of draws. So whether to draw again is decided together: after each draw the ranks' counts of kept groups
are gathered (one all-gather) and all stop at the same draw. The step's batch is global (``batches.py``
exchanges every rank's sequences before planning the updates), so ranks may keep different numbers of groups: a
rank whose groups were all filtered simply contributes fewer. A surplus over the step's size is trimmed from the
ranks that kept the most. A rank left with nothing still hands one group to the exchange, marked not to train,
so that every rank's tensors have rows.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ...scoring import ScoredRollout, concat, select_groups


def informative_groups(group_rewards: torch.Tensor) -> list[int]:
    """Indices of the groups (rows of ``[groups, n]``) whose rewards are not all equal."""
    spread = group_rewards.max(dim=1).values - group_rewards.min(dim=1).values
    return [index for index, value in enumerate(spread.tolist()) if value > 0]


def shares(counts: list[int], wanted: int) -> list[int]:
    """How many of its kept groups each rank trains on: all of them while the ranks together kept at most
    ``wanted``; else ``wanted`` in all, the surplus taken one group at a time from the rank that kept the most
    (ties: the higher rank), so the shares stay as even as the counts allow. The same on every rank."""
    take = list(counts)
    for _ in range(sum(take) - wanted):
        largest = max(range(len(take)), key=lambda rank: (take[rank], rank))
        take[largest] -= 1
    return take


@dataclasses.dataclass
class SamplingResult:
    batch: ScoredRollout  # what this rank hands to the step's batch
    drawn: list[ScoredRollout]  # every draw, for the metrics (they all come from the current policy)
    draws: int
    groups_drawn: int
    groups_kept: int  # groups with a learning signal in ``batch``
    groups_filtered: int  # groups dropped for equal rewards
    full: bool  # the ranks found the step's groups before the draws ran out
    trains: bool = True  # False: ``batch`` is a placeholder (this rank's share is 0), left out of the update

    def metrics(self) -> dict[str, float]:
        """Per-rank figures, to be summed over ranks (``sampling/draws`` is the same on every rank)."""
        return {"sampling/groups_drawn": float(self.groups_drawn), "sampling/groups_kept": float(self.groups_kept),
                "sampling/groups_filtered": float(self.groups_filtered), "sampling/draws": float(self.draws),
                "sampling/batch_full": float(self.full)}


def fill_batch(draw: Callable[[], ScoredRollout], *, groups_wanted: int, max_draws: int,
               gather_counts: Callable[[int], list[int]], rank: int, pad_token_id: int) -> SamplingResult:
    """Call ``draw()`` (generate and score one batch of prompts) until the ranks together hold ``groups_wanted``
    groups with unequal rewards, or ``max_draws`` draws were made; return this rank's share (``shares``).

    ``gather_counts(n)`` returns every rank's ``n`` in rank order (an all-gather; ``[n]`` on one rank). Every rank
    makes the same draws and calls, so none waits for a collective alone. When no rank kept any group, every rank
    trains on its last draw as it is (advantages of 0: only the KL term, if any, moves the policy).
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
        counts = gather_counts(len(kept))
        if sum(counts) >= groups_wanted or len(drawn) >= max_draws:
            break
    full = sum(counts) >= groups_wanted
    metrics = {"drawn": drawn, "draws": len(drawn), "groups_drawn": sum(len(s.samples) for s in drawn),
               "groups_filtered": len(dropped), "full": full}
    if sum(counts) == 0:
        return SamplingResult(batch=scored, groups_kept=0, **metrics)
    take = shares(counts, groups_wanted)[rank]
    chosen = kept[:take] if take else (dropped or kept)[:1]
    parts = [select_groups(scored, [g for s, g in chosen if s is scored]) for scored in drawn
             if any(s is scored for s, _ in chosen)]
    return SamplingResult(batch=concat(parts, pad_token_id), groups_kept=take, trains=bool(take), **metrics)


def summary(totals: dict[str, float], world_size: int) -> dict[str, float]:
    """The ``sampling/*`` metrics of a step from ``SamplingResult.metrics()`` summed over ranks; empty without
    dynamic sampling. Groups are counted over all ranks; ``sampling/draws`` per rank (the same on all);
    ``sampling/batch_full`` 0.0 when the draws ran out before the step's groups were found."""
    if "sampling/draws" not in totals:
        return {}
    return {"sampling/groups_drawn": totals["sampling/groups_drawn"],
            "sampling/groups_kept": totals["sampling/groups_kept"],
            "sampling/groups_filtered": totals["sampling/groups_filtered"],
            "sampling/draws": totals["sampling/draws"] / world_size,
            "sampling/batch_full": totals["sampling/batch_full"] / world_size}
