"""Pure-torch building blocks for GRPO: group-relative advantages, the clipped policy loss,
loss aggregation over masked tokens, and per-token KL penalties against a reference policy.

Shapes: ``B`` sequences (responses), ``T`` response tokens each. A ``mask`` / ``response_mask``
is 1 (or True) for real response tokens and 0 for padding; padded positions never contribute.
Nothing here knows about devices: tensors stay where the caller put them.
"""

from collections.abc import Sequence

import torch
from torch import Tensor

AGGREGATION_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean")
KL_KINDS = ("k1", "abs", "k2", "k3")

_LOG_RATIO_LIMIT = 20.0  # keeps exp() finite (exp(20) ~ 4.9e8) when two policies disagree wildly
_K3_LIMIT = 10.0


def grpo_advantages(scores: Tensor, group_ids, *, eps: float = 1e-6, norm_by_std: bool = True) -> Tensor:
    """Group-relative advantage of each sequence: its score minus the mean score of its group
    (the responses sampled for the same prompt), divided by (group std + eps) when ``norm_by_std``.
    ``norm_by_std=False`` gives the "Dr. GRPO" variant (mean-centred only).

    ``scores``: float [B]. ``group_ids``: int tensor [B] or any length-B sequence of hashables.
    The std is the unbiased one (as ``torch.std``). A group with a single member has no spread to
    compare against; as in the common open implementations its mean is taken as 0 and its std as 1,
    so its advantage is ``score / (1 + eps)`` (normalised) or ``score`` (not normalised).
    Returns float32 [B] on the device of ``scores``.
    """
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

    advantages = torch.empty_like(scores)
    for indices in members.values():
        idx = torch.tensor(indices, device=scores.device)
        group = scores[idx]
        if len(indices) == 1:
            mean, std = torch.zeros_like(group[0]), torch.ones_like(group[0])
        else:
            mean, std = group.mean(), group.std()
        centred = group - mean
        advantages[idx] = centred / (std + eps) if norm_by_std else centred
    return advantages


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is set; 0 (not NaN) when nothing is set."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def aggregate_loss(values: Tensor, mask: Tensor, mode: str) -> Tensor:
    """Reduce per-token ``values`` [B, T] to a scalar, counting only tokens where ``mask`` is set.

    - ``token-mean``: every real token in the batch weighs the same.
    - ``token-sum``: plain sum over real tokens (no length normalisation).
    - ``seq-mean-token-sum``: sum within each sequence, then mean over the B sequences.
    - ``seq-mean-token-mean``: mean within each sequence, then mean over the B sequences.

    Token counts used as denominators are clamped to at least 1, so an all-padding batch (or an
    all-padding sequence) contributes 0 instead of NaN. Fully padded sequences still count in
    the B of the ``seq-mean-*`` modes.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ in shape")
    mask = mask.to(values.dtype)
    masked = values * mask
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if mode == "token-sum":
        return masked.sum()
    if mode == "seq-mean-token-sum":
        return masked.sum(dim=-1).mean()
    if mode == "seq-mean-token-mean":
        return (masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)).mean()
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGGREGATION_MODES}")


def micro_batch_scale(mask: Tensor, mode: str, micro_batches: int) -> tuple[float, Tensor | float]:
    """``(scale, weight)`` for one micro-batch's aggregated loss, for ``FSDPEngine.forward_backward_batch``.

    The engine averages micro-batch losses weighted by ``weight`` over all ``micro_batches`` of a global batch
    (every micro-batch of the mini-batch on every rank). For the means that weight is the micro-batch's number of
    tokens (``token-mean``) or sequences (``seq-mean-*``), which gives the mean over the global batch. For
    ``token-sum`` every micro-batch weighs the same and the loss is multiplied by their number, so the result is
    the plain sum over all tokens of the global batch, as the mode says.
    """
    if mode == "token-mean":
        return 1.0, mask.sum()
    if mode == "token-sum":
        return float(micro_batches), 1.0
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return 1.0, float(mask.size(0))
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGGREGATION_MODES}")


def policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate loss (to minimise) for the policy that produced ``log_prob``.

    ``log_prob``, ``old_log_prob``, ``response_mask``: [B, T]. ``advantages``: [B] (one per
    sequence, broadcast over its tokens) or [B, T]. The per-token loss is the pessimistic
    ``max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))`` with the log-ratio
    clamped to [-20, 20] before ``exp``. With ``clip_c`` (> 1), tokens with A < 0 additionally
    have their loss capped at ``-A * clip_c`` (dual clipping), so one very unlikely old action
    cannot dominate the update. Gradients flow to ``log_prob`` only through the returned loss;
    the metrics are detached Python floats.
    """
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"clip_c must be greater than 1.0 for dual clipping, got {clip_c}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(log_prob.dtype)

    log_ratio = (log_prob - old_log_prob).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)

    negative = advantages < 0
    if clip_c is not None:
        cap = -advantages * clip_c
        dual_active = negative & (per_token > cap)
        per_token = torch.where(negative, torch.minimum(per_token, cap), per_token)

    loss = aggregate_loss(per_token, response_mask, agg)

    with torch.no_grad():
        mask = response_mask.detach()
        metrics = {
            "clip_frac": masked_mean((clipped > unclipped).float(), mask).item(),
            "clip_frac_lower": masked_mean(dual_active.float(), mask).item() if clip_c is not None else 0.0,
            "approx_kl": masked_mean(-log_ratio.detach(), mask).item(),
            "ratio_mean": masked_mean(ratio.detach(), mask).item(),
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
