"""Pure-torch building blocks for GRPO and its relatives: group-relative advantages, DAPO's overlong penalty,
the policy losses (PPO-clip, GSPO, CISPO), loss aggregation over masked tokens, and per-token KL penalties
against a reference policy. ``loss_types.py`` names the combinations (``algorithm.loss_type``).

Shapes: ``B`` sequences (responses), ``T`` response tokens each. A ``mask`` / ``response_mask``
is 1 (or True) for real response tokens and 0 for padding; padded positions never contribute.
Nothing here knows about devices: tensors stay where the caller put them.
"""

from collections.abc import Sequence

import torch
from torch import Tensor

from .gae import gae_advantages  # noqa: F401  (PPO's estimator, public here with the others)

AGGREGATION_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                     "micro-batch-token-mean")
LOSS_MODES = ("vanilla", "gspo", "cispo")
SCALE_MODES = ("group", "batch", "none")
KL_KINDS = ("k1", "abs", "k2", "k3")

_LOG_RATIO_LIMIT = 20.0  # keeps exp() finite (exp(20) ~ 4.9e8) when two policies disagree wildly
_K3_LIMIT = 10.0


def grpo_advantages(scores: Tensor, group_ids, *, scale: str | None = None, eps: float = 1e-6,
                    norm_by_std: bool | None = None, batch_std: float | Tensor | None = None) -> Tensor:
    """Group-relative advantage of each sequence: its score minus the mean score of its group (the responses
    sampled for the same prompt), divided according to ``scale``:

    - ``group`` (default): by (the group's std + eps): GRPO;
    - ``batch``: by (the whole batch's std + eps), still centred per group (TRL's ``scale_rewards="batch"``);
    - ``none``: not divided (Dr. GRPO).

    ``scores``: float [B]. ``group_ids``: int tensor [B] or any length-B sequence of hashables. Stds are the
    unbiased ones (as ``torch.std``). ``batch_std``: the std to use for ``batch`` when ``scores`` is only part of
    the batch (one rank's share); default: the std of ``scores``. ``norm_by_std`` is the older spelling
    (True: ``group``, False: ``none``). A group with a single member has no spread to compare against; as in the
    common open implementations its mean is taken as 0 and its std as 1. Returns float32 [B] on the device of
    ``scores``.
    """
    if norm_by_std is not None:
        implied = "group" if norm_by_std else "none"
        if scale is not None and scale != implied:
            raise ValueError(f"norm_by_std={norm_by_std} contradicts scale={scale!r}: pass only scale")
        scale = implied
    scale = scale or "group"
    if scale not in SCALE_MODES:
        raise ValueError(f"unknown scale {scale!r}; expected one of {SCALE_MODES}")
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    if isinstance(group_ids, Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D [B], got shape {tuple(group_ids.shape)}")
        group_ids = group_ids.tolist()
    elif not isinstance(group_ids, Sequence):
        group_ids = list(group_ids)
    if len(group_ids) != scores.shape[0]:
        raise ValueError(f"scores has {scores.shape[0]} entries but group_ids has {len(group_ids)}")

    scores = scores.detach().to(torch.float32)
    members: dict = {}
    for index, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(index)

    if scale == "batch":
        if batch_std is None:
            batch_std = scores.std() if scores.numel() > 1 else torch.ones(())
        batch_std = torch.as_tensor(batch_std, dtype=torch.float32, device=scores.device)
    advantages = torch.empty_like(scores)
    for indices in members.values():
        idx = torch.tensor(indices, device=scores.device)
        group = scores[idx]
        if len(indices) == 1:
            mean, std = torch.zeros_like(group[0]), torch.ones_like(group[0])
        else:
            mean, std = group.mean(), group.std()
        centred = group - mean
        if scale == "group":
            centred = centred / (std + eps)
        elif scale == "batch":
            centred = centred / (batch_std + eps)
        advantages[idx] = centred
    return advantages


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer_len: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment, to add to each sequence's reward: 0 up to ``max_new_tokens - buffer_len``
    response tokens, then falling linearly to ``-factor`` at ``max_new_tokens`` (and never below it).

    ``lengths``: [B] response tokens (counting the EOS). ``buffer_len`` 0 turns it off (all zeros).
    """
    lengths = lengths.to(torch.float32)
    if buffer_len <= 0:
        return torch.zeros_like(lengths)
    if buffer_len >= max_new_tokens:
        raise ValueError(f"buffer_len ({buffer_len}) must be smaller than max_new_tokens ({max_new_tokens})")
    excess = lengths - (max_new_tokens - buffer_len)
    return (-excess / buffer_len * factor).clamp(min=-factor, max=0.0)


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

    loss = aggregate_loss(per_token, response_mask, agg, norm_length, counts)

    with torch.no_grad():
        mask = response_mask.detach()
        ratio = ratio.detach().expand_as(log_prob)
        metrics = {
            "clip_frac": masked_mean(clipped_fraction.float().expand_as(log_prob), mask, counts).item(),
            "clip_frac_lower": (masked_mean(dual_active.float(), mask, counts).item() if dual_active is not None
                                else 0.0),
            "approx_kl": masked_mean(-log_ratio.detach(), mask, counts).item(),
            "ratio_mean": masked_mean(ratio, mask, counts).item(),
        }
    return loss, metrics


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
