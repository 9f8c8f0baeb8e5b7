"""Generalized advantage estimation (GAE, Schulman et al. 2016) over response tokens, for PPO with a critic.

Tensors are ``[B, T]`` in verl's layout: ``token_rewards`` (a sequence's reward on its last response token, a
per-token KL penalty anywhere), ``values`` (the critic's value of each response position) and ``response_mask``
(1 where the policy acted). A token the mask leaves out (padding, a tool's or an environment's tokens inside a
multi-turn rollout) is not an action: it has no TD error of its own, and the value and advantage flow past it from
the next action to the previous one, as if it were not there. Nothing is bootstrapped past the last token.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``values`` minus their mean over ``mask``, divided by their (unbiased) std over it, as verl whitens."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = (values * mask).sum() / count
    variance = (((values - mean) ** 2) * mask).sum() / count
    if count > 1:
        variance = variance * count / (count - 1)  # Bessel's correction, as verl's masked_var
    return (values - mean) * torch.rsqrt(variance + eps)


def gae_advantages(token_rewards: Tensor, values: Tensor, response_mask: Tensor, *, gamma: float,
                   lam: float) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)``, both ``[B, T]``: ``returns`` = the unwhitened GAE advantages + ``values`` (the
    critic's targets); ``advantages`` whitened over ``response_mask`` of the tensors given (all their rows; positions
    off the mask hold the next action's, whitened alike, and take no loss)."""
    raw, returns = gae_returns(token_rewards, values, response_mask, gamma=gamma, lam=lam)
    return masked_whiten(raw, response_mask), returns


def gae_returns(token_rewards: Tensor, values: Tensor, response_mask: Tensor, *, gamma: float,
                lam: float) -> tuple[Tensor, Tensor]:
    """``(advantages before whitening, returns)``: a trainer whitens over every rank's batch itself."""
    rewards, values = token_rewards.float(), values.float()
    acts = response_mask.to(torch.bool)
    steps = rewards.size(1)
    next_value = torch.zeros_like(rewards[:, 0])  # the value after the next action (0 past the end)
    running = torch.zeros_like(rewards[:, 0])  # the advantage of the next action
    found = [None] * steps
    for t in range(steps - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        here = delta + gamma * lam * running
        act = acts[:, t]
        running = torch.where(act, here, running)  # a non-action carries the next action's figures through
        next_value = torch.where(act, values[:, t], next_value)
        found[t] = running
    advantages = torch.stack(found, dim=1)
    return advantages, advantages + values
