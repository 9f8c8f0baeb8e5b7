"""The reward model's Bradley-Terry loss, with TRL's meanings (``RewardTrainer``), on each pair's rewards (the
score at the last token of prompt + response): ``-log sigmoid(r_c - r_r - m)`` with the pair's margin ``m``
(``rm.margin_key``; 0 without), plus ``rm.center_rewards_coef * (r_c + r_r)^2`` (which keeps the rewards centred
on zero), each the mean over the pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

METRICS = ("accuracy", "rewards/margins", "rewards/chosen", "rewards/rejected")


def pair_losses(chosen: torch.Tensor, rejected: torch.Tensor, margins: torch.Tensor | None = None,
                center_coef: float = 0.0) -> torch.Tensor:
    """Each pair's loss ``[P]`` (see the module docstring)."""
    difference = chosen - rejected - (margins if margins is not None else 0.0)
    losses = -F.logsigmoid(difference)
    if center_coef:
        losses = losses + center_coef * (chosen + rejected) ** 2
    return losses


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """The pairs' figures, each a mean over them (detached): a pair is accurate when its chosen reward is higher."""
    chosen, rejected = chosen.detach(), rejected.detach()
    return {"accuracy": (chosen > rejected).float().mean(), "rewards/margins": (chosen - rejected).mean(),
            "rewards/chosen": chosen.mean(), "rewards/rejected": rejected.mean()}
