"""PPO's algorithm on the RL step (``engine/rl/algorithm.py``): the sequence's reward is the outcome the critic's
GAE turns into per-token advantages (``trainer.py``, once the step's batch and the critic's values are in), and the
loss is the clipped policy gradient with the optional KL to a reference and entropy bonus."""

from __future__ import annotations

from ...rl.algorithm import Algorithm
from ...rl.engine_settings import engine_config
from ...rl.frozen import FrozenSpec
from ...rl.terms import Norm, entropy_bonus, kl_to, policy_gradient


class PPOAlgorithm(Algorithm):
    def __init__(self, config) -> None:
        self.config = config

    def frozen_models(self, world_size: int) -> dict:
        a = self.config.algorithm
        if a.kl_loss_coef > 0:
            return {"ref": FrozenSpec(engine_config(self.config, world_size, frozen_offload=a.ref_param_offload))}
        return {}

    def advantages(self, scored, context, leads):
        return scored.rewards  # the outcome, on each response's last token once GAE runs

    def terms(self) -> list:
        a = self.config.algorithm
        norm = Norm(a.loss_agg)
        terms = [policy_gradient(norm, loss_mode="vanilla", clip_low=a.clip_low, clip_high=a.clip_high)]
        if a.kl_loss_coef > 0:
            terms.append(kl_to("ref", a.kl_loss_coef, norm, kind=a.kl_kind))
        if a.entropy_coeff > 0:
            terms.append(entropy_bonus(a.entropy_coeff, norm))
        return terms
