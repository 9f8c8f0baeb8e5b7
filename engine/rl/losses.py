"""The per-token losses and their reductions: the clipped policy gradient (PPO-clip, GSPO, CISPO), the KL estimates
against a frozen model, and the aggregation of per-token values over masked tokens (``algorithm.loss_agg``).
``engine/rl/terms.py`` makes the step's loss of them; ``engine.grpo.algorithms`` is their public name.

Shapes: ``B`` sequences (responses), ``T`` response tokens each. A ``mask`` / ``response_mask`` is 1 (or True) for
real response tokens and 0 for padding; padded positions never contribute. Nothing here knows about devices:
tensors stay where the caller put them.
"""

import torch
from torch import Tensor

AGGREGATION_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                     "micro-batch-token-mean")
LOSS_MODES = ("vanilla", "gspo", "cispo")
KL_KINDS = ("k1", "abs", "k2", "k3")

_LOG_RATIO_LIMIT = 20.0  # keeps exp() finite (exp(20) ~ 4.9e8) when two policies disagree wildly
_K3_LIMIT = 10.0


def masked_mean(values: Tensor, mask: Tensor, counts: Tensor | None = None) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is set; 0 (not NaN) when nothing is set. ``counts``: the
    mask whose size divides (default ``mask``; see ``aggregate_loss``)."""
    mask = mask.to(values.dtype)
    counts = mask if counts is None else counts.to(values.dtype)
    return (values * mask).sum() / counts.sum().clamp(min=1.0)


def aggregate_loss(values: Tensor, mask: Tensor, mode: str, norm_length: float | None = None,
                   counts: Tensor | None = None) -> Tensor:
    """Reduce per-token ``values`` [B, T] to a scalar, counting only tokens where ``mask`` is set.

    - ``token-mean``: every real token in the batch weighs the same.
    - ``token-sum``: plain sum over real tokens (no length normalisation).
    - ``seq-mean-token-sum``: sum within each sequence, then mean over the B sequences.
    - ``seq-mean-token-mean``: mean within each sequence, then mean over the B sequences.
    - ``seq-mean-token-sum-norm``: sum within each sequence divided by the constant ``norm_length`` (Dr. GRPO: the
      longest response allowed), then mean over the B sequences.
    - ``micro-batch-token-mean``: within one micro-batch the same as ``token-mean``; ``micro_batch_scale`` then
      gives every micro-batch the same weight (TRL's ``bnpo``).

    Token counts used as denominators are clamped to at least 1, so an all-padding batch (or an all-padding
    sequence) contributes 0 instead of NaN. Fully padded sequences still count in the B of the ``seq-mean-*``
    modes.

    ``counts`` (default ``mask``): the mask the denominators are counted from. A rank of a sequence-parallel group
    passes its own tokens as ``mask`` and the whole micro-batch's as ``counts``: every mode is a sum of per-token
    terms over fixed denominators, so the group's results add up to the whole micro-batch's.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ in shape")
    mask = mask.to(values.dtype)
    counts = mask if counts is None else counts.to(values.dtype)
    masked = values * mask
    if mode in ("token-mean", "micro-batch-token-mean"):
        return masked.sum() / counts.sum().clamp(min=1.0)
    if mode == "token-sum":
        return masked.sum()
    if mode == "seq-mean-token-sum":
        return masked.sum(dim=-1).mean()
    if mode == "seq-mean-token-mean":
        return (masked.sum(dim=-1) / counts.sum(dim=-1).clamp(min=1.0)).mean()
    if mode == "seq-mean-token-sum-norm":
        if norm_length is None or norm_length <= 0:
            raise ValueError(f"seq-mean-token-sum-norm needs a positive norm_length (the longest response "
                             f"allowed), got {norm_length!r}")
        return (masked.sum(dim=-1) / norm_length).mean()
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGGREGATION_MODES}")


def micro_batch_scale(mask: Tensor, mode: str, micro_batches: int | None = None) -> tuple[float, Tensor | float]:
    """``(scale, weight)`` for one micro-batch's aggregated loss, for ``FSDPEngine.forward_backward_batch``.

    The engine averages micro-batch losses weighted by ``weight`` over all micro-batches of a global mini-batch
    (every micro-batch of the mini-batch on every rank), so the result equals one pass over the whole mini-batch:

    - ``token-mean``: the micro-batch's number of loss tokens (at least 1e-6, so that a mini-batch whose every
      response is masked makes a zero update instead of an error; its loss is 0 then);
    - ``seq-mean-*``: its number of sequences (``seq-mean-token-sum-norm`` divides by a constant, so it is a mean
      over sequences too);
    - ``micro-batch-token-mean``: 1, so every micro-batch's token mean weighs the same, however many tokens it
      holds (this depends on how the mini-batch was split, by definition);
    - ``token-sum``: 1, and the loss is multiplied by ``micro_batches``, the number of micro-batches of the
      mini-batch over all ranks, so the result is the plain sum over all of its tokens.

    Only what the micro-batch holds is used, plus ``micro_batches`` for ``token-sum``.
    """
    if mode == "token-mean":
        return 1.0, mask.sum().to(torch.float32).clamp(min=1e-6)
    if mode == "token-sum":
        if micro_batches is None or micro_batches < 1:
            raise ValueError("token-sum needs micro_batches, the number of micro-batches of the mini-batch over "
                             "all ranks")
        return float(micro_batches), 1.0
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        return 1.0, float(mask.size(0))
    if mode == "micro-batch-token-mean":
        return 1.0, 1.0
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGGREGATION_MODES}")


def _sequence_log_ratio(log_ratio: Tensor, mask: Tensor, counts: Tensor, across) -> Tensor:
    """Mean token log-ratio of each sequence, [B, 1] (0 for a sequence without tokens); ``across`` sums the
    sequences' partial sums over the ranks holding their other tokens."""
    mask, counts = mask.to(log_ratio.dtype), counts.to(log_ratio.dtype)
    return (across((log_ratio * mask).sum(dim=-1)) / counts.sum(dim=-1).clamp(min=1.0)).unsqueeze(-1)


def policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_mode: str = "vanilla",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    agg: str = "token-mean",
    norm_length: float | None = None,
    counts: Tensor | None = None,
    across=None,
) -> tuple[Tensor, dict[str, float]]:
    """Policy-gradient loss (to minimise) for the policy that produced ``log_prob``, reduced with
    ``aggregate_loss(per_token, response_mask, agg, norm_length)``.

    ``log_prob``, ``old_log_prob``, ``response_mask``: [B, T]. ``advantages``: [B] (one per sequence, broadcast
    over its tokens) or [B, T]. ``r`` is the per-token ratio ``exp(log_prob - old_log_prob)``, its log clamped to
    [-20, 20] before ``exp``. Per token, by ``loss_mode``:

    - ``vanilla`` (PPO-clip, GRPO): ``max(-A * r, -A * clamp(r, 1 - clip_low, 1 + clip_high))``. With ``clip_c``
      (> 1), tokens with A < 0 additionally have their loss capped at ``-A * clip_c`` (dual clipping).
    - ``gspo`` (GSPO): the same with the sequence ratio ``s = exp(mean over the sequence's tokens of
      log r)`` in place of ``r``, so a sequence is clipped as a whole; the gradient reaches each token as
      ``s * grad log_prob`` (value ``s`` everywhere), which gives the paper's gradient with every aggregation here.
    - ``cispo`` (CISPO): ``-detach(clamp(r, 1 - clip_low, 1 + clip_high)) * A * log_prob``: the clipped
      importance weight carries no gradient, so every token keeps its policy gradient.

    Gradients flow to ``log_prob`` only through the returned loss; the metrics are detached Python floats.

    On one rank's share of a sequence-parallel micro-batch: ``response_mask`` marks the rank's own tokens,
    ``counts`` the whole micro-batch's (the normalisers, as in ``aggregate_loss``) and ``across`` sums a tensor
    over the group (GSPO's sequence ratio needs every token of a sequence); loss and metrics are then the rank's
    shares, which add up over the group to those of the whole micro-batch.
    """
    counts = response_mask if counts is None else counts
    per_token, metrics = clipped_policy_gradient(log_prob, old_log_prob, advantages, response_mask,
                                                 loss_mode=loss_mode, clip_low=clip_low, clip_high=clip_high,
                                                 clip_c=clip_c, counts=counts, across=across)
    return aggregate_loss(per_token, response_mask, agg, norm_length, counts), metrics


def clipped_policy_gradient(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                            loss_mode: str = "vanilla", clip_low: float = 0.2, clip_high: float = 0.2,
                            clip_c: float | None = None, counts: Tensor | None = None,
                            across=None) -> tuple[Tensor, dict[str, float]]:
    """``policy_loss`` before its aggregation: ``(per-token loss [B, T], metrics)``; the arguments are
    ``policy_loss``'s, the metrics Python floats (``device_clipped_policy_gradient`` keeps them on the device)."""
    per_token, metrics = device_clipped_policy_gradient(
        log_prob, old_log_prob, advantages, response_mask, loss_mode=loss_mode, clip_low=clip_low,
        clip_high=clip_high, clip_c=clip_c, counts=counts, across=across)
    return per_token, dict(zip(metrics, torch.stack(list(metrics.values())).tolist(), strict=True))


def device_clipped_policy_gradient(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor,
                                   response_mask: Tensor, *, loss_mode: str = "vanilla", clip_low: float = 0.2,
                                   clip_high: float = 0.2, clip_c: float | None = None, counts: Tensor | None = None,
                                   across=None) -> tuple[Tensor, dict[str, Tensor]]:
    """``clipped_policy_gradient`` with its metrics as detached 0-dim tensors where the loss is (the policy-gradient
    term of the step's loss, ``engine/rl/terms.py``): the engine sums them over micro-batches on the device and the
    host reads them once a step, not once per micro-batch."""
    counts = response_mask if counts is None else counts
    across = across or (lambda value: value)
    if loss_mode not in LOSS_MODES:
        raise ValueError(f"unknown loss_mode {loss_mode!r}; expected one of {LOSS_MODES}")
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"clip_c must be greater than 1.0 for dual clipping, got {clip_c}")
    if clip_c is not None and loss_mode != "vanilla":
        raise ValueError(f"clip_c (dual clipping) applies to loss_mode='vanilla' only, not {loss_mode!r}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(log_prob.dtype)

    log_ratio = (log_prob - old_log_prob).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    token_ratio = torch.exp(log_ratio)
    low, high = 1.0 - clip_low, 1.0 + clip_high
    clipped_fraction: Tensor
    dual_active = None
    if loss_mode == "cispo":
        weight = token_ratio.clamp(low, high).detach()
        per_token = -weight * advantages * log_prob
        ratio = token_ratio
        clipped_fraction = (token_ratio < low) | (token_ratio > high)
    else:
        if loss_mode == "gspo":
            sequence = _sequence_log_ratio((log_prob - old_log_prob).detach(), response_mask, counts, across)
            sequence = sequence.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT).detach()
            # Value: the sequence's log-ratio at every token; gradient: that of the token's own log-prob.
            ratio = torch.exp(log_prob - log_prob.detach() + sequence)
        else:
            ratio = token_ratio
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(low, high)
        per_token = torch.maximum(unclipped, clipped)
        clipped_fraction = clipped > unclipped
        if clip_c is not None:
            negative = advantages < 0
            cap = -advantages * clip_c
            dual_active = negative & (per_token > cap)
            per_token = torch.where(negative, torch.minimum(per_token, cap), per_token)

    with torch.no_grad():
        mask = response_mask.detach()
        ratio = ratio.detach().expand_as(log_prob)
        clip_frac = masked_mean(clipped_fraction.float().expand_as(log_prob), mask, counts)
        metrics = {
            "clip_frac": clip_frac,
            "clip_frac_lower": (masked_mean(dual_active.float(), mask, counts) if dual_active is not None
                                else torch.zeros_like(clip_frac)),
            "approx_kl": masked_mean(-log_ratio.detach(), mask, counts),
            "ratio_mean": masked_mean(ratio, mask, counts),
        }
    return per_token, metrics


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate [B, T] of KL(policy || reference) from sampled-token log-probs.

    ``k1``: log-ratio (unbiased, can be negative); ``abs``: its magnitude; ``k2``: half its
    square; ``k3``: ``exp(r) - r - 1`` with ``r = ref - logp`` (unbiased and never negative),
    with ``r`` clamped to [-20, 20] and the result to [-10, 10] for numerical safety.
    """
    diff = log_prob - ref_log_prob
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "k3":
        r = (-diff).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
        return (torch.exp(r) - r - 1.0).clamp(-_K3_LIMIT, _K3_LIMIT)
    raise ValueError(f"unknown KL kind {kind!r}; expected one of {KL_KINDS}")
