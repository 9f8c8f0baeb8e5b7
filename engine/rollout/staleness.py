"""Which weights each sample came from, and how stale it is when trained on.

A vLLM server labels every token it samples with its weight version (``/inference/v1/generate``'s
``weight_versions``: spans ``{"version", "start", "end"}`` over a response's tokens; the label is what the last
push's ``/finish_weight_update`` gave). The trainer keeps a table label -> its own version (the updates the pushed
weights had), so a sample's oldest and newest versions are known in the trainer's numbering, and its staleness
when trained at step ``t`` (the policy then has ``t`` updates) is ``t - oldest``. A label the trainer never pushed
(a server restarted with other weights) has no version: such a sample is always too stale.
"""

from __future__ import annotations

import torch

from .engines.vllm_shared import SEED_RANGE

UNKNOWN = -(2**31)  # the version of a label the trainer never pushed


class VersionRecorder:
    """``engine`` (one with ``sample(prompts, sampling, seed) -> (Responses, spans per row)``) seen as a plain
    rollout engine by a sampler: each call samples with a seed drawn from ``generator`` (the sampler thread's own,
    per rank and step; never the global torch generator) and keeps every row's weight-version spans, in order."""

    multi_turn = False  # one generate() per batch: rows and spans line up

    def __init__(self, engine, generator: torch.Generator) -> None:
        self.engine, self.generator = engine, generator
        self.name = engine.name
        self.spans: list[list[dict]] = []

    def generate(self, prompts, sampling):
        seed = int(torch.randint(0, SEED_RANGE, (1,), generator=self.generator).item())
        responses, spans = self.engine.sample(prompts, sampling, seed)
        self.spans += spans
        return responses


def row_versions(spans: list[list[dict] | None], versions: dict[str, int], default: int) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """Each row's oldest and newest weight version (``[B]`` long); ``versions``: label -> the trainer's version;
    ``default``: a row with no token (no span) counts as sampled at this version."""
    oldest, newest = [], []
    for row in spans:
        found = [versions.get(span["version"], UNKNOWN) for span in row or []]
        oldest.append(min(found, default=default))
        newest.append(max(found, default=default))
    return torch.tensor(oldest, dtype=torch.long), torch.tensor(newest, dtype=torch.long)


def stale_groups(oldest: torch.Tensor, step: int, bound: int, group_size: int) -> torch.Tensor:
    """``[B]`` bool: the rows of every group in which some row is more than ``bound`` versions older than
    ``step`` (a group is trained whole or not at all: its advantages compare its rows)."""
    stale = (step - oldest) > bound
    return stale.view(-1, group_size).any(dim=1).repeat_interleave(group_size)


def staleness_figures(oldest: torch.Tensor, step: int, dropped: torch.Tensor,
                      lengths: torch.Tensor) -> tuple[dict, dict]:
    """``(sums, maxima)`` of one rank's batch for the loop's reductions: the staleness of the rows trained on,
    their count, the rows dropped as too stale and their response tokens (``lengths``: [B], not trained)."""
    kept = (step - oldest)[~dropped].double()
    return ({"staleness_sum": float(kept.sum()), "staleness_rows": float(kept.numel()),
             "dropped_stale": float(dropped.sum()), "stale_tokens": float(lengths[dropped].sum())},
            {"staleness_max": float(kept.max()) if kept.numel() else 0.0})


def synchronous_figures(rows: int) -> tuple[dict, dict]:
    """The same figures for a step sampled with the weights it trains (staleness 0, nothing dropped)."""
    return ({"staleness_sum": 0.0, "staleness_rows": float(rows), "dropped_stale": 0.0, "stale_tokens": 0.0},
            {"staleness_max": 0.0})
