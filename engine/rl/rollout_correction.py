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
  tokens, one weight for all its tokens;
- ``band`` (IcePop): ``w = r`` where ``1/cap <= r <= cap``, else 0: a token is left out when the engines disagree
  in either direction, not only when the trainer's probability is the larger;
- ``seq_geo_mask``: a sequence is left out when the geometric mean of its token ratios,
  ``G = exp(mean log r)`` over its loss tokens, lies outside ``[1/cap, cap]``; the tokens of the sequences kept
  weigh ``min(r, cap)``. ``R`` is a product of as many factors as the sequence has tokens, so at thousands of
  tokens it leaves any band (and float32) even where every token agrees closely; ``G`` is a mean, computed in log
  space, and finite at any length.

The default is ``token_truncate`` with ``cap = 2``: it costs nothing where the engines agree (the ratios stay
near 1 and are never cut) and bounds the variance where they do not. Everything is computed over the loss mask
(the tokens the model produced; tool output and padding are left out) and carries no gradient.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

CORRECTION_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "band",
                    "seq_geo_mask")
SEQUENCE_MODES = ("sequence_truncate", "sequence_mask", "seq_geo_mask")  # one ratio per sequence
MASK_MODES = ("token_mask", "sequence_mask", "band", "seq_geo_mask")  # tokens left out of the gradient
BAND_MODES = ("band", "seq_geo_mask")  # a band [1/cap, cap]: needs cap > 1
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
    difference = torch.where(mask, log_probs.detach().float() - sampling_log_probs.float(), 0.0)
    log_ratio = difference.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    if mode == "seq_geo_mask":
        return _geometric_mask(difference, log_ratio, mask, cap, across)
    if mode in SEQUENCE_MODES:
        sums = log_ratio.sum(dim=-1) if across is None else across(log_ratio.sum(dim=-1))
        ratios = sums.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT).exp()  # [B]
        per_token = ratios.unsqueeze(-1).expand_as(log_ratio)
    else:
        ratios = per_token = log_ratio.exp()
    if mode == "none":
        weights = torch.ones_like(per_token)
    elif mode.endswith("truncate"):
        weights = per_token.clamp(max=cap)
    elif mode == "band":  # compared in log space: the band's two edges are symmetric there
        weights = per_token.masked_fill(log_ratio.abs() > math.log(cap), 0.0)
    elif mode == "sequence_mask":  # the same decision the sequence counts take (sequences_left_out)
        weights = per_token.masked_fill(sequences_left_out(mode, cap, ratios).unsqueeze(-1), 0.0)
    else:
        weights = per_token.masked_fill(per_token > cap, 0.0)
    masked = (weights == 0) & mask if mode in MASK_MODES else torch.zeros_like(mask)
    return weights * mask, ratios, masked


def _geometric_mask(difference: Tensor, log_ratio: Tensor, mask: Tensor, cap: float, across):
    """``seq_geo_mask``: the mean log-ratio of each sequence over its loss tokens (all of them: with sequence
    parallelism the sums and the counts are added over the group), its sequences outside the band left out."""
    totals = torch.stack([difference.sum(dim=-1), mask.sum(dim=-1).float()])  # [2, B]: one sum over the group
    totals = totals if across is None else across(totals)
    ratios = (totals[0] / totals[1].clamp(min=1.0)).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT).exp()
    outside = sequences_left_out("seq_geo_mask", cap, ratios)
    weights = log_ratio.exp().clamp(max=cap).masked_fill(outside.unsqueeze(-1), 0.0)
    return weights * mask, ratios, outside.unsqueeze(-1) & mask


def sequences_left_out(mode: str, cap: float, ratios: Tensor) -> Tensor | None:
    """``[B]`` bool: the sequences a sequence mask mode leaves out whole, from their ratios (None in the other
    modes). A rank of a sequence-parallel group may hold none of a sequence's loss tokens, so the count of masked
    sequences is taken from this, not from the tokens it masked."""
    if mode == "sequence_mask":
        return ratios > cap
    if mode == "seq_geo_mask":  # in log space: the band's two edges are symmetric there
        return ratios.log().abs() > math.log(cap)
    return None


@dataclasses.dataclass
class MismatchStats:
    """Sums, minima and maxima over a step's micro-batches (one rank), turned into the ``rollout/*`` metrics.

    They stay on the device the micro-batches are on and are read once, when the step's metrics are made
    (``sums``, ``maxima``): a read per micro-batch would make the host wait for the device's queue each time.
    Counts are int64 (exact), figures float32 (what collectives reduce everywhere)."""

    counts: Tensor | None = None  # [5] int64: loss tokens, ratios counted, tokens masked out, and in the sequence
    # modes the sequences counted and those masked out (zeros in the token modes)
    figures: Tensor | None = None  # [2] float32: sum of |log-prob differences|, sum of ratios
    extremes: Tensor | None = None  # [3] float32: largest difference, largest ratio, minus the smallest ratio

    def add(self, log_probs: Tensor, sampling_log_probs: Tensor, mask: Tensor, ratios: Tensor,
            masked: Tensor, sequences: Tensor | None = None, left_out: Tensor | None = None) -> None:
        """One micro-batch: the absolute log-prob differences over its loss tokens, and its ratios (over loss
        tokens, or over ``sequences``, by default those with a loss token; a rank of a sequence-parallel group
        counts its own tokens and, the first rank only, the micro-batch's sequences); ``left_out``: the sequences
        a sequence mask mode left out (``sequences_left_out``)."""
        keep = mask.to(torch.bool)
        sequences = keep.any(dim=-1) if sequences is None else sequences
        device = log_probs.device
        if self.counts is None:
            self.counts = torch.zeros(5, dtype=torch.int64, device=device)
            self.figures = torch.zeros(2, dtype=torch.float32, device=device)
            self.extremes = torch.tensor([0.0, -math.inf, -math.inf], device=device)
        counted = keep if ratios.dim() == 2 else sequences.to(device)
        if not keep.numel() and not ratios.numel():
            return  # a filler without rows
        diff = (log_probs.detach().float() - sampling_log_probs.float()).abs()
        ratios = ratios.float()
        per_sequence = counted if ratios.dim() == 1 else torch.zeros_like(sequences, dtype=torch.bool)
        left_out = per_sequence & left_out.to(device) if left_out is not None else torch.zeros_like(per_sequence)
        self.counts += torch.stack([keep.sum(), counted.sum(), masked.sum(), per_sequence.sum(),
                                    left_out.sum()]).to(torch.int64)
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
        tokens, ratios, masked, sequences, masked_sequences = (self.counts.tolist() if self.counts is not None
                                                               else (0, 0, 0, 0, 0))
        diff_sum, ratio_sum = self.figures.tolist() if self.figures is not None else (0.0, 0.0)
        return {"mismatch/tokens": float(tokens), "mismatch/diff_sum": diff_sum, "mismatch/ratios": float(ratios),
                "mismatch/ratio_sum": ratio_sum, "mismatch/masked": float(masked),
                "mismatch/sequences": float(sequences), "mismatch/masked_sequences": float(masked_sequences)}

    def maxima(self) -> dict[str, float]:
        """This rank's figures whose largest over ranks counts (the minimum as its negation)."""
        extremes = self.extremes.tolist() if self.extremes is not None else (0.0, -math.inf, -math.inf)
        return dict(zip(("mismatch/diff_max", "mismatch/ratio_max", "mismatch/ratio_min_negated"), extremes,
                        strict=True))

    @staticmethod
    def reduced(totals: dict[str, float], largest: dict[str, float]) -> dict[str, float]:
        """The ``rollout/*`` metrics from ``sums()`` added over ranks and the largest ``maxima()``; empty when no
        rank had a loss token. ``rollout/is_masked_frac``: the share of loss tokens left out (every mode); in the
        sequence modes ``rollout/is_masked_frac/sequence`` too: the share of sequences left out."""
        if not totals["mismatch/tokens"]:
            return {}
        tokens = totals["mismatch/tokens"]
        per_sequence = {"rollout/is_masked_frac/sequence": totals["mismatch/masked_sequences"] /
                        totals["mismatch/sequences"]} if totals["mismatch/sequences"] else {}
        return {**per_sequence, "rollout/logprob_diff_mean": totals["mismatch/diff_sum"] / tokens,
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
