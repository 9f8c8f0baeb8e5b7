"""PPO's algorithm on the RL step (``engine/rl/algorithm.py``): a critic trained beside the policy
(``trained_models``); the sequence's reward is the outcome the critic's GAE turns into per-token advantages
(``engine.grpo.algorithms.gae_advantages``' recursion, whitened over the global batch) once the step's batch is
gathered; the loss is the clipped policy gradient with the optional KL to a reference and entropy bonus; after
the policy's update the critic's own updates fit its values to the returns (``critic_update.py``). For the first
``critic.warmup_steps`` steps only the critic trains. The frame checkpoints both engines as one step; export writes
the policy."""

from __future__ import annotations

import dataclasses

import torch

from ....runtime import phase
from ...advantages import outcome_token_rewards, whiten
from ...algorithm import Algorithm
from ...engine_settings import engine_config
from ...frozen import FrozenSpec
from ...gae import gae_returns
from ...terms import Norm, entropy_bonus, kl_to, policy_gradient
from ...trained import TrainedSpec
from . import checks
from .critic import critic_factory
from .critic_update import planned_values, update_critic
from .schema import PRESETS, PPOConfig

CRITIC = "critic"  # the trained model's name: its checkpoint part (critic/) and StepContext.trained's key


def critic_engine_config(config, world_size: int):
    """The policy's engine options with the critic's learning rate and offload (no LoRA: the critic trains whole)."""
    c = config.critic
    return dataclasses.replace(engine_config(config, world_size), lr=c.lr, param_offload=c.param_offload,
                               optimizer_offload=c.optimizer_offload, lora_rank=0)


class PPOAlgorithm(Algorithm):
    tool, help, schema, presets, curves = "accel-ppo", checks.HELP, PPOConfig, PRESETS, checks.CURVES
    path_keys = ("critic.path",)
    resume_fixed = {"critic.path": "the critic the checkpoint holds"}

    @classmethod
    def check(cls, config, world_size, tool):
        return checks.check(config, world_size, tool)

    def frozen_models(self, world_size: int) -> dict:
        a = self.config.algorithm
        if a.kl_loss_coef > 0:
            return {"ref": FrozenSpec(engine_config(self.config, world_size, frozen_offload=a.ref_param_offload))}
        return {}

    def trained_models(self, world_size: int) -> dict:
        path, seed = self.config.critic.path, self.config.train.seed
        return {CRITIC: TrainedSpec(critic_engine_config(self.config, world_size),
                                    lambda source: critic_factory(source, path, seed))}

    def advantages(self, scored, context, leads):
        return scored.rewards  # the outcome, on each response's last token once GAE runs

    def token_advantages(self, data, context) -> torch.Tensor:
        """GAE over the critic's values of this rank's rows, whitened over the global batch (each group's rows
        counted once); the returns and values are kept for the critic's update."""
        a = self.config.algorithm
        own = data.own_rows()
        mask = data.loss_mask[own]
        with phase("values"):
            values = planned_values(context.trained[CRITIC], self.config, data, context.device)
        raw, returns = gae_returns(outcome_token_rewards(data.advantages[own], mask), values[own], mask,
                                   gamma=a.gamma, lam=a.lam)

        def total(sums: dict) -> dict:
            return context.total(context.groups.once(sums))

        advantages = torch.zeros(data.loss_mask.shape)
        advantages[own] = whiten(raw, mask, total)
        full_returns = torch.zeros(data.loss_mask.shape)
        full_returns[own] = returns
        data.kept.update(returns=full_returns, old_values=values)
        return advantages

    def terms(self) -> list:
        a = self.config.algorithm
        norm = Norm(a.loss_agg)
        terms = [policy_gradient(norm, loss_mode="vanilla", clip_low=a.clip_low, clip_high=a.clip_high)]
        if a.kl_loss_coef > 0:
            terms.append(kl_to("ref", a.kl_loss_coef, norm, kind=a.kl_kind))
        if a.entropy_coeff > 0:
            terms.append(entropy_bonus(a.entropy_coeff, norm))
        return terms

    def updates_policy(self, step: int) -> bool:
        return step >= self.config.critic.warmup_steps  # the critic warms up first

    def after_update(self, data, step: int, context) -> dict:
        return update_critic(context.trained[CRITIC], self.config, data, context.device)
