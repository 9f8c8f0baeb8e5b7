"""Advantage estimators and reward combinations (``algorithm.advantage``, ``algorithm.multi_reward``;
``docs/algorithms.md``): GRPO's group-relative advantages, RLOO's leave-one-out baseline, REINFORCE++ (per-token
returns normalised over the global batch) with and without a group baseline, GDPO's per-reward normalisation, and
DAPO's overlong penalty. ``engine.grpo.algorithms`` is their public name.

Per-sequence estimators take ``scores`` [B] and ``group_ids`` (the responses to one prompt share an id; a rank
holds whole groups). Per-token estimators take verl's layout: ``token_rewards`` and ``response_mask`` [B, T] (a
response's outcome reward at its last loss token, plus any per-token reward such as a KL penalty); positions
with mask 0 (padding, a multi-turn response's tool tokens) earn nothing and carry the return through. Their
normalisation is over the global batch: with a process group initialised every rank passes its own rows and the
statistics are summed over all ranks (one all-reduce of three numbers).
"""

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

SCALE_MODES = ("group", "batch", "none")
SEQUENCE_ESTIMATORS = ("grpo", "rloo")  # one advantage per sequence
TOKEN_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")  # one per token, normalised over the global batch
ADVANTAGE_ESTIMATORS = SEQUENCE_ESTIMATORS + TOKEN_ESTIMATORS
MULTI_REWARD_MODES = ("sum_then_normalize", "normalize_then_sum")
WHITEN_EPS = 1e-8

Totals = Callable[[dict[str, float]], dict[str, float]]  # sums a few named numbers over the ranks that share a batch


def group_members(scores: Tensor, group_ids) -> dict:
    """``{group id: [row indices]}`` in first-seen order, after checking ``scores`` [B] against ``group_ids``."""
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
    members: dict = {}
    for index, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(index)
    return members


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
    members = group_members(scores, group_ids)
    scores = scores.detach().to(torch.float32)

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


def rloo_advantages(scores: Tensor, group_ids) -> Tensor:
    """RLOO: each sequence's score minus the mean score of the other members of its group,
    ``A_i = R_i - (sum_j R_j - R_i) / (K - 1)`` for a group of ``K`` (no scaling). A group of one has no other
    member: its baseline is 0 (``A_i = R_i``), as in verl. Returns float32 [B] on the device of ``scores``."""
    members = group_members(scores, group_ids)
    scores = scores.detach().to(torch.float32)
    advantages = scores.clone()
    for indices in members.values():
        if len(indices) < 2:
            continue
        idx = torch.tensor(indices, device=scores.device)
        group = scores[idx]
        advantages[idx] = group - (group.sum() - group) / (len(indices) - 1)
    return advantages


def normalize_in_groups(values: Tensor, group_ids, eps: float = 1e-6) -> Tensor:
    """``(v - group mean) / (group std + eps)`` per sequence (unbiased std; a group of one: mean 0, std 1, as
    ``grpo_advantages``)."""
    return grpo_advantages(values, group_ids, scale="group", eps=eps)


def combine_rewards(by_function: Tensor, weights: Sequence[float], group_ids, *, mode: str = "sum_then_normalize",
                    eps: float = 1e-6) -> Tensor:
    """The score the estimator sees from several reward functions' values ``by_function`` [F, B] and their
    ``weights``: ``sum_then_normalize``: their weighted sum (the estimator then normalises it); ``normalize_then_sum``
    (GDPO): each function's values normalised within their group first (``normalize_in_groups``), then weighted
    and summed, so that a reward with a wide range does not drown the others."""
    if mode not in MULTI_REWARD_MODES:
        raise ValueError(f"unknown multi_reward {mode!r}; expected one of {MULTI_REWARD_MODES}")
    if by_function.dim() != 2 or by_function.size(0) != len(weights):
        raise ValueError(f"by_function must be [F, B] with one weight per function, got shape "
                         f"{tuple(by_function.shape)} and {len(weights)} weights")
    values = by_function.detach().to(torch.float32)
    if mode == "normalize_then_sum":
        values = torch.stack([normalize_in_groups(row, group_ids, eps) for row in values]) if len(values) else values
    combined = torch.zeros(values.size(1), dtype=torch.float32, device=values.device)
    for weight, row in zip(weights, values, strict=True):
        combined = combined + float(weight) * row
    return combined


def outcome_token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """``[B, T]`` token rewards holding each sequence's score at its last loss token (zeros elsewhere; nothing for
    a sequence without loss tokens): an outcome reward in the per-token estimators' layout."""
    mask = response_mask.to(torch.bool)
    positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values  # -1: no loss token
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=scores.device)
    rows = torch.nonzero(last >= 0).flatten()
    rewards[rows, last[rows]] = scores.detach().to(torch.float32)[rows]
    return rewards


def returns_to_go(token_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` over each response's loss tokens, from its end; a position with mask 0 adds
    nothing and is not discounted: it passes the return of the tokens after it to the tokens before it (a
    multi-turn response's tool output), and padding past the end holds 0. float32 [B, T]."""
    if token_rewards.shape != response_mask.shape or token_rewards.dim() != 2:
        raise ValueError(f"token_rewards {tuple(token_rewards.shape)} and response_mask "
                         f"{tuple(response_mask.shape)} must both be [B, T]")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    rewards = token_rewards.detach().to(torch.float32)
    live = response_mask.to(torch.bool)
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.size(0), dtype=torch.float32, device=rewards.device)
    for t in reversed(range(rewards.size(1))):
        running = torch.where(live[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return returns


def world_totals(device: torch.device | None = None) -> Totals:
    """Sums over every rank of the default process group (identity without one): the global batch of ranks that
    each pass their own rows. The sums travel on ``device``, by default the backend's ``metrics_device()``: never
    the rewards' own device, the host, which NCCL and HCCL do not reduce on."""
    def total(sums: dict[str, float]) -> dict[str, float]:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return sums
        import accel_backends

        from ..runtime import sum_over_ranks

        return sum_over_ranks(sums, device or accel_backends.get_backend().metrics_device())

    return total


def whiten(values: Tensor, response_mask: Tensor, total: Totals | None = None, eps: float = WHITEN_EPS) -> Tensor:
    """``(v - mean) / sqrt(var + eps)`` at every loss token, 0 elsewhere: the mean and the unbiased variance over
    the loss tokens of the global batch, from sums in float64 that ``total`` adds over ranks (default: this
    rank's rows alone). Fewer than two loss tokens: centred only."""
    mask = response_mask.to(torch.bool)
    wide = values.detach().to(torch.float64)
    kept = wide[mask]
    sums = (total or (lambda s: s))({"tokens": float(kept.numel()), "sum": float(kept.sum()),
                                     "squares": float((kept * kept).sum())})
    count = sums["tokens"]
    if count < 1:
        return torch.zeros(values.shape, dtype=torch.float32, device=values.device)
    mean = sums["sum"] / count
    variance = max(sums["squares"] - count * mean * mean, 0.0) / (count - 1) if count > 1 else None
    scaled = wide - mean if variance is None else (wide - mean) / (variance + eps) ** 0.5
    return torch.where(mask, scaled, 0.0).to(torch.float32)


def reinforce_pp_advantages(token_rewards: Tensor, response_mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """REINFORCE++: each loss token's return ``G_t = sum over the loss tokens from t on of gamma^k r`` (a KL
    penalty folded into the token rewards counts from where it is paid), normalised over the global batch's loss
    tokens (``whiten``). float32 [B, T], 0 where the mask is 0."""
    return whiten(returns_to_go(token_rewards, response_mask, gamma), response_mask, world_totals())


def reinforce_pp_baseline_advantages(token_rewards: Tensor, response_mask: Tensor, group_ids) -> Tensor:
    """REINFORCE++ with a group baseline: each sequence's total reward (its token rewards over its loss tokens)
    minus the mean total of its group (a group of one: baseline 0), given to every loss token, then normalised over
    the global batch's loss tokens (``whiten``). float32 [B, T], 0 where the mask is 0."""
    mask = response_mask.to(torch.bool)
    totals = (token_rewards.detach().to(torch.float32) * mask).sum(dim=-1)
    centred = group_baseline_removed(totals, group_ids)
    return whiten(centred.unsqueeze(-1).expand(mask.shape) * mask, response_mask, world_totals())


def group_baseline_removed(totals: Tensor, group_ids) -> Tensor:
    """Each sequence's ``totals`` minus its group's mean (a group of one keeps its total)."""
    members = group_members(totals, group_ids)
    centred = totals.clone()
    for indices in members.values():
        if len(indices) > 1:
            idx = torch.tensor(indices, device=totals.device)
            centred[idx] = totals[idx] - totals[idx].mean()
    return centred
