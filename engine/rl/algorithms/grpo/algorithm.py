"""GRPO's algorithm on the RL step (``engine/rl/algorithm.py``): its advantage choice (``algorithm.advantage``:
grpo, rloo, reinforce_pp, reinforce_pp_baseline; ``algorithm.multi_reward``), DAPO's dynamic sampling and
overlong penalty, and the loss terms its loss type names (``loss_types.py``): the clipped policy gradient, the KL
to the reference and the entropy bonus, all with the loss type's aggregation."""

from __future__ import annotations

import math

import torch

from ...advantages import (
    TOKEN_ESTIMATORS,
    combine_rewards,
    group_baseline_removed,
    grpo_advantages,
    outcome_token_rewards,
    returns_to_go,
    rloo_advantages,
    whiten,
)
from ...algorithm import Algorithm, Drawn, StepContext
from ...frozen import FrozenSpec
from ...losses import kl_penalty
from ...terms import Norm, entropy_bonus, kl_to, policy_gradient
from . import config as grpo_config
from . import dynamic_sampling
from .config import deprecation_notices, engine_config
from .help import HELP
from .loss_types import LossSettings, resolve
from .report import CURVES, curves_for


class GRPOAlgorithm(Algorithm):
    """The loss type's settings resolved once, when it is built (``settings``: a frozen ``LossSettings``); the
    estimator's keys are read from the run's config where used."""

    tool, help, schema, presets, curves = "accel-grpo", HELP, grpo_config.GRPOConfig, grpo_config.PRESETS, CURVES
    resume_fixed = {"algorithm.loss_type": "the loss"}  # beside the RL layer's and the frame's

    @classmethod
    def commands(cls):
        from .tiny_model_command import main as make_tiny_model_main

        return {"make-tiny-model": make_tiny_model_main}

    @classmethod
    def migrate(cls, config):
        return grpo_config.apply_loss_type(config)

    @classmethod
    def check(cls, config, world_size, tool):
        return grpo_config.check(config, world_size)

    @classmethod
    def curves_for(cls, config):
        return curves_for(config.algorithm)

    @classmethod
    def eval_offload(cls, config):
        return config.algorithm.ref_param_offload  # evaluated as the reference model is held

    def __init__(self, config) -> None:
        super().__init__(config)
        # ``algorithm.loss_type``'s recipe with the keys set explicitly, as concrete settings: once.
        self.settings: LossSettings = resolve(config.algorithm, config.rollout.max_new_tokens)

    @property
    def needs_old_log_probs(self) -> bool:  # the KL folded into the token rewards is the sampling policy's
        a = self.config.algorithm
        return a.advantage in TOKEN_ESTIMATORS and a.kl_reward_coef > 0

    @property
    def mask_truncated(self) -> bool:
        return self.config.algorithm.mask_truncated

    @property
    def overlong(self) -> tuple[int, float]:
        a = self.config.algorithm
        return a.overlong_buffer_len, a.overlong_penalty_factor

    def frozen_models(self, world_size: int) -> dict:
        a = self.config.algorithm
        if self.settings.kl_loss_coef > 0 or (a.advantage in TOKEN_ESTIMATORS and a.kl_reward_coef > 0):
            return {"ref": FrozenSpec(engine_config(self.config, world_size, frozen=True))}
        return {}

    def draw(self, draw, context: StepContext, prompts_per_step: int) -> Drawn:
        a = self.config.algorithm
        if not a.filter_groups:
            return super().draw(draw, context, prompts_per_step)
        # DAPO dynamic sampling: all ranks draw until the step's groups are found
        result = dynamic_sampling.fill_batch(draw, groups_wanted=prompts_per_step, max_draws=a.max_gen_batches,
                                             gather_counts=context.groups.counts, rank=context.groups.rank,
                                             pad_token_id=context.pad_token_id)
        return Drawn(result.batch, result.drawn, result.metrics(), result.trains)

    def scores(self, scored, groups: torch.Tensor, context: StepContext) -> torch.Tensor:
        """What the estimator sees: the rewards' weighted sum (with the overlong penalty), or with
        ``multi_reward=normalize_then_sum`` each reward normalised in its group first (GDPO)."""
        if self.config.algorithm.multi_reward != "normalize_then_sum":
            return scored.rewards
        return combine_rewards(scored.by_function, context.reward_weights, groups,
                               mode="normalize_then_sum") + scored.overlong

    def advantages(self, scored, context: StepContext, leads: bool) -> torch.Tensor:
        a = self.config.algorithm
        groups = torch.arange(len(scored)) // scored.n
        scores = self.scores(scored, groups, context)
        if a.advantage == "rloo":
            return rloo_advantages(scores, groups)
        if a.advantage in TOKEN_ESTIMATORS:
            return scores  # the outcome; per token once the step's batch is gathered
        scale = self.settings.scale_rewards
        batch_std = global_std(scores if leads else scores[:0], context.total) if scale == "batch" else None
        return grpo_advantages(scores, groups, scale=scale, batch_std=batch_std)

    def token_advantages(self, data, context: StepContext) -> torch.Tensor | None:
        """REINFORCE++ (with or without the group baseline) on this rank's share of the step: the outcome at the
        last loss token, minus ``kl_reward_coef`` x the sampling policy's k1 KL to the reference at every token,
        normalised over the global batch (each data-parallel group's rows counted once)."""
        a = self.config.algorithm
        if a.advantage not in TOKEN_ESTIMATORS:
            return None
        own = data.own_rows()
        mask = data.loss_mask[own]
        token_rewards = outcome_token_rewards(data.advantages[own], mask)
        if a.kl_reward_coef > 0:
            kl = kl_penalty(data.old_log_probs[own], data.ref_log_probs[own], "k1") * mask
            token_rewards = token_rewards - a.kl_reward_coef * kl

        def total(sums: dict) -> dict:
            return context.total(context.groups.once(sums))

        if a.advantage == "reinforce_pp":
            values = whiten(returns_to_go(token_rewards, mask, a.gamma), mask, total)
        else:  # each sequence's total reward, less its group's mean (a group's members may be on other ranks)
            if a.kl_reward_coef > 0:
                totals = torch.zeros(len(data.advantages))
                totals[own] = token_rewards.sum(dim=-1)
                totals = context.groups.sum_rows(totals)
            else:  # the outcome alone: every rank has every sequence's
                totals = outcome_token_rewards(data.advantages, data.loss_mask).sum(dim=-1)
            centred = group_baseline_removed(totals, torch.arange(len(totals)) // self.config.rollout.n)
            values = whiten(centred[own].unsqueeze(-1) * mask, mask, total)
        out = torch.zeros(data.loss_mask.shape)
        out[own] = values
        return out

    def terms(self) -> list:
        s = self.settings
        norm = Norm(s.agg, s.norm_length)
        terms = [policy_gradient(norm, loss_mode=s.loss_mode, clip_low=s.clip_low, clip_high=s.clip_high,
                                 clip_c=s.clip_c)]
        if s.kl_loss_coef > 0:
            terms.append(kl_to("ref", s.kl_loss_coef, norm, kind=s.kl_kind))
        if s.entropy_coeff > 0:
            terms.append(entropy_bonus(s.entropy_coeff, norm))
        return terms

    def metrics(self, totals: dict, groups: int) -> dict:
        return dynamic_sampling.summary(totals, groups)  # sampling/*, with filter_groups

    def notices(self, world_size: int) -> list[str]:
        return deprecation_notices(self.config, world_size)


def global_std(values: torch.Tensor, total) -> float:
    """The (unbiased) std of ``values`` over every rank's (``total`` sums over ranks; a rank passes the values it
    hands to the batch)."""
    t = total({"n": float(len(values)), "sum": values.sum().item(), "sq": (values.double() ** 2).sum().item()})
    return math.sqrt(max(t["sq"] - t["sum"] ** 2 / t["n"], 0.0) / max(t["n"] - 1.0, 1.0))
