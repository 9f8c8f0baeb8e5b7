"""``rloo``: an RL algorithm as one module, no recipe class (docs/adding-a-trainer.md). RLOO advantages, a
token-mean policy gradient and a KL term to a frozen reference; the class attributes make its command (``accel-train
rloo``): help, schema, presets. Everything else (data, rewards, rollout engines, the step's batch, log-probs,
updates, validation, checkpoints, commands, the shared sections' checks) is the RL layer's and the frame's.
``plugin.py`` registers it (``register_algorithms``)."""

from __future__ import annotations

import dataclasses

import torch

from engine.rl.advantages import rloo_advantages
from engine.rl.algorithm import Algorithm
from engine.rl.engine_settings import engine_config
from engine.rl.frozen import FrozenSpec
from engine.rl.schema import RLConfig
from engine.rl.terms import Norm, kl_to, policy_gradient


@dataclasses.dataclass
class RLOOAlgorithmConfig:
    kl_coef: float = 0.01  # the KL term to the reference
    ref_param_offload: bool = True
    rollout_correction: str = "token_truncate"  # the policy gradient's importance weights (rollout_correction.py)
    rollout_correction_cap: float = 2.0


@dataclasses.dataclass
class RLOOConfig(RLConfig):  # the RL layer's sections, and its own algorithm section
    algorithm: RLOOAlgorithmConfig = dataclasses.field(default_factory=RLOOAlgorithmConfig)
    trainer: str = "rloo"


class RLOO(Algorithm):
    help = "RLOO on the RL layer: leave-one-out advantages, a policy gradient and a KL term to the reference."
    schema = RLOOConfig
    presets = {"default": {}, "cpu-demo": {"nproc": 2, "model": {"path": "builtin:tiny-char"},
                                           "data": {"task": "echo"}, "rollout": {"n": 4, "max_new_tokens": 4},
                                           "train": {"steps": 2, "prompts_per_step": 4},
                                           "engine": {"fsdp_version": 2, "lr": 2e-3}}}

    def frozen_models(self, world_size):
        offload = self.config.algorithm.ref_param_offload
        return {"ref": FrozenSpec(engine_config(self.config, world_size, frozen_offload=offload))}

    def advantages(self, scored, context, leads):
        return rloo_advantages(scored.rewards, torch.arange(len(scored)) // scored.n)

    def terms(self):
        norm = Norm("token-mean")
        return [policy_gradient(norm), kl_to("ref", self.config.algorithm.kl_coef, norm)]
