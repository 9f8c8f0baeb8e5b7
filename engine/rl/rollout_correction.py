"""Rollout/training mismatch: how far the rollout engine's log-probs are from the trainer's, and the truncated or
masked importance sampling that corrects for it (``algorithm.rollout_correction``, ``_cap``).

An engine with its own kernels (vLLM) samples from a distribution slightly different from the one the trainer
computes for the same policy and tokens (other kernels, other precision, weights not yet pushed). With ``p`` the
trainer's probability of a sampled token under the policy that sampled it and ``q`` the engine's, the per-token
ratio is ``r = p / q`` and the policy-gradient term of each token is weighted by ``w``:

- ``none``: ``w = 1`` (the ratios are still measured);
- ``token_truncate``: ``w = min(r, cap)`` (truncated importance sampling);
- ``token_mask``: ``w = r`` where ``r <= cap``, else 0 (the token is left out of the gradient);
- ``sequence_truncate`` / ``sequence_mask``: the same with the sequence's ratio ``R = prod r`` over its loss
  tokens, one weight for all its tokens.

The default is ``token_truncate`` with ``cap = 2``: it costs nothing where the engines agree (the ratios stay
near 1 and are never cut) and bounds the variance where they do not. Everything is computed over the loss mask
(the tokens the model produced; tool output and padding are left out) and carries no gradient.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

CORRECTION_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
DEFAULT_CORRECTION = "token_truncate"
DEFAULT_CAP = 2.0
_LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 4.9e8: keeps the ratio finite when the two disagree wildly


def importance_weights(log_probs: Tensor, sampling_log_probs: Tensor, mask: Tensor, mode: str,
                       cap: float, across=None) -> tuple[Tensor, Tensor, Tensor]:
    """``(weights [B, T], ratios, masked [B, T] bool)``: the weight of each token's policy-gradient term, the
    ratios the mode works on (per token ``[B, T]``, or per sequence ``[B]`` for the sequence modes) and the loss
    tokens a mask mode left out. ``log_probs``: the trainer's, for the policy that sampled; all detached.
    ``across``: sums a sequence's log-ratio over the ranks holding its other tokens (sequence parallelism, where
    ``mask`` marks this rank's own tokens)."""
    if mode not in CORRECTION_MODES:
        raise ValueError(f"unknown rollout correction {mode!r}; expected one of {CORRECTION_MODES}")
    mask = mask.to(torch.bool)
    log_ratio = ((log_probs.detach().float() - sampling_log_probs.float()) * mask).clamp(-_LOG_RATIO_LIMIT,
                                                                                          _LOG_RATIO_LIMIT)
    if mode.startswith("sequence"):
        sums = log_ratio.sum(dim=-1) if across is None else across(log_ratio.sum(dim=-1))
        ratios = sums.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT).exp()  # [B]
        per_token = ratios.unsqueeze(-1).expand_as(log_ratio)
    else:
        ratios = per_token = log_ratio.exp()
    if mode == "none":
        weights = torch.ones_like(per_token)
    elif mode.endswith("truncate"):
        weights = per_token.clamp(max=cap)
    else:
        weights = per_token.masked_fill(per_token > cap, 0.0)
    masked = (per_token > cap) & mask if mode.endswith("mask") else torch.zeros_like(mask)
    return weights * mask, ratios, masked


@dataclasses.dataclass
class MismatchStats:
    """Sums, minima and maxima over a step's micro-batches (one rank), turned into the ``rollout/*`` metrics.

    They stay on the device the micro-batches are on and are read once, when the step's metrics are made
    (``sums``, ``maxima``): a read per micro-batch would make the host wait for the device's queue each time.
    Counts are int64 (exact), figures float32 (what collectives reduce everywhere)."""

    counts: Tensor | None = None  # [3] int64: loss tokens, ratios counted, tokens masked out
    figures: Tensor | None = None  # [2] float32: sum of |log-prob differences|, sum of ratios
    extremes: Tensor | None = None  # [3] float32: largest difference, largest ratio, minus the smallest ratio

    def add(self, log_probs: Tensor, sampling_log_probs: Tensor, mask: Tensor, ratios: Tensor,
            masked: Tensor, sequences: Tensor | None = None) -> None:
        """One micro-batch: the absolute log-prob differences over its loss tokens, and its ratios (over loss
        tokens, or over ``sequences``, by default those with a loss token; a rank of a sequence-parallel group
        counts its own tokens and, the first rank only, the micro-batch's sequences)."""
        keep = mask.to(torch.bool)
        sequences = keep.any(dim=-1) if sequences is None else sequences
        device = log_probs.device
        if self.counts is None:
            self.counts = torch.zeros(3, dtype=torch.int64, device=device)
            self.figures = torch.zeros(2, dtype=torch.float32, device=device)
            self.extremes = torch.tensor([0.0, -math.inf, -math.inf], device=device)
        counted = keep if ratios.dim() == 2 else sequences.to(device)
        if not keep.numel() and not ratios.numel():
            return  # a filler without rows
        diff = (log_probs.detach().float() - sampling_log_probs.float()).abs()
        ratios = ratios.float()
        self.counts += torch.stack([keep.sum(), counted.sum(), masked.sum()]).to(torch.int64)
        self.figures += torch.stack([torch.where(keep, diff, 0.0).sum(), torch.where(counted, ratios, 0.0).sum()])
        self.extremes = torch.maximum(self.extremes, torch.stack([
            _largest(torch.where(keep, diff, -math.inf)), _largest(torch.where(counted, ratios, -math.inf)),
            _largest(torch.where(counted, -ratios, -math.inf))]))

    @classmethod
    def total(cls, parts) -> MismatchStats:
        """Several micro-batches' own statistics added up in their order (the extremes the largest), on the device:
        no read. ``None`` parts (not recorded) count nothing."""
        out = cls()
        for part in parts:
            if part is None or part.counts is None:
                continue
            if out.counts is None:
                out.counts, out.figures, out.extremes = part.counts.clone(), part.figures.clone(), part.extremes
            else:
                out.counts += part.counts
                out.figures += part.figures
                out.extremes = torch.maximum(out.extremes, part.extremes)
        return out

    def sums(self) -> dict[str, float]:
        """This rank's figures to add over ranks (``reduced`` makes the metrics of the totals)."""
        tokens, ratios, masked = self.counts.tolist() if self.counts is not None else (0, 0, 0)
        diff_sum, ratio_sum = self.figures.tolist() if self.figures is not None else (0.0, 0.0)
        return {"mismatch/tokens": float(tokens), "mismatch/diff_sum": diff_sum, "mismatch/ratios": float(ratios),
                "mismatch/ratio_sum": ratio_sum, "mismatch/masked": float(masked)}

    def maxima(self) -> dict[str, float]:
        """This rank's figures whose largest over ranks counts (the minimum as its negation)."""
        extremes = self.extremes.tolist() if self.extremes is not None else (0.0, -math.inf, -math.inf)
        return dict(zip(("mismatch/diff_max", "mismatch/ratio_max", "mismatch/ratio_min_negated"), extremes,
                        strict=True))

    @staticmethod
    def reduced(totals: dict[str, float], largest: dict[str, float]) -> dict[str, float]:
        """The ``rollout/*`` metrics from ``sums()`` added over ranks and the largest ``maxima()``; empty when no
        rank had a loss token."""
        if not totals["mismatch/tokens"]:
            return {}
        tokens = totals["mismatch/tokens"]
        return {"rollout/logprob_diff_mean": totals["mismatch/diff_sum"] / tokens,
                "rollout/logprob_diff_max": largest["mismatch/diff_max"],
                "rollout/is_ratio_mean": totals["mismatch/ratio_sum"] / max(totals["mismatch/ratios"], 1.0),
                "rollout/is_ratio_min": -largest["mismatch/ratio_min_negated"],
                "rollout/is_ratio_max": largest["mismatch/ratio_max"],
                "rollout/is_masked_frac": totals["mismatch/masked"] / tokens}

    def metrics(self, sum_over_ranks, max_over_ranks) -> dict[str, float]:
        """The step's metrics over every rank (every rank must call it), with the caller's reductions:
        ``sum_over_ranks(dict) -> dict`` and ``max_over_ranks(float) -> float``."""
        largest = {key: max_over_ranks(value) for key, value in self.maxima().items()}
        return self.reduced(sum_over_ranks(self.sums()), largest)


def _largest(values: Tensor) -> Tensor:
    """The largest of ``values`` (``-inf`` when there are none), as a 0-dim tensor: no read of the device."""
    return values.max() if values.numel() else values.new_tensor(-math.inf)
