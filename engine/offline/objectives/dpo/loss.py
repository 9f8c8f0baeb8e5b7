"""DPO's formulas, with TRL's meanings (``DPOTrainer``), on per-pair sequence log-probs (each the sum over a
response's scored tokens) under the policy and the frozen reference.

With ``h = (log pi(c) - log ref(c)) - (log pi(r) - log ref(r))`` for a pair's chosen ``c`` and rejected ``r``:

* ``sigmoid`` (DPO): ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``; ``eps`` is
  ``dpo.label_smoothing``, the probability that a label is flipped (conservative DPO; 0: plain DPO);
* ``hinge`` (SLiC): ``max(0, 1 - beta h)``;
* ``ipo``: ``(h' - 1 / (2 beta))^2`` with ``h'`` the same difference of log-ratios, each divided by its
  response's token count (as TRL computes IPO).

When the policy is the reference, ``h = 0``: sigmoid gives ``ln 2``, hinge 1, ipo ``1 / (4 beta^2)``. The implicit
rewards are ``beta (log pi - log ref)`` of each response; a pair is accurate when its chosen reward is the higher.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOSS_TYPES = ("sigmoid", "ipo", "hinge")
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")


def pair_losses(chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
                *, beta: float, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
                chosen_tokens: torch.Tensor | None = None, rejected_tokens: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Each pair's loss ``[P]`` (see the module docstring); ``*_tokens``: the responses' token counts (ipo)."""
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    if loss_type == "sigmoid":
        h = beta * (chosen_ratio - rejected_ratio)
        return -(1.0 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    if loss_type == "hinge":
        return torch.relu(1.0 - beta * (chosen_ratio - rejected_ratio))
    if loss_type == "ipo":
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("the ipo loss needs each response's token count")
        h = chosen_ratio / chosen_tokens.clamp(min=1) - rejected_ratio / rejected_tokens.clamp(min=1)
        return (h - 1.0 / (2.0 * beta)) ** 2
    raise ValueError(f"unknown DPO loss type {loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
                 beta: float) -> dict[str, torch.Tensor]:
    """TRL's figures of a set of pairs, each the mean over them (detached)."""
    chosen, rejected = chosen.detach(), rejected.detach()
    chosen_reward, rejected_reward = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
    return {"rewards/chosen": chosen_reward.mean(), "rewards/rejected": rejected_reward.mean(),
            "rewards/accuracies": (chosen_reward > rejected_reward).float().mean(),
            "rewards/margins": (chosen_reward - rejected_reward).mean(),
            "logps/chosen": chosen.mean(), "logps/rejected": rejected.mean()}
