"""PPO's config schema: the RL layer's shared sections (``engine/rl/schema.py``), its own ``algorithm.*`` and the
critic's ``critic.*`` (a second trained engine), and its presets."""

from __future__ import annotations

import dataclasses

from ...model import BUILTIN_MODEL
from ...rollout_correction import DEFAULT_CAP, DEFAULT_CORRECTION
from ...schema import RLConfig


@dataclasses.dataclass
class AlgorithmConfig:
    gamma: float = 1.0  # GAE's discount over the response's tokens
    lam: float = 0.95  # GAE's lambda (1: Monte Carlo returns less the value, 0: one-step TD errors)
    clip_low: float = 0.2  # the policy ratio's clip range below 1
    clip_high: float = 0.2  # and above
    value_clip: float | None = 0.2  # the critic's new values stay within this of the old ones in its loss; null: off
    loss_agg: str = "token-mean"  # the policy loss's aggregation (algorithms.AGGREGATION_MODES)
    entropy_coeff: float = 0.0  # > 0 subtracts entropy_coeff x the aggregated token entropy from the loss
    kl_loss_coef: float = 0.0  # > 0 adds a KL loss to a frozen reference model
    kl_kind: str = "k3"
    ref_param_offload: bool = True  # keep the reference model in host memory between uses
    # Importance sampling against the rollout engine's own log-probs (engine/rl/rollout_correction.py): the modes
    # and the cap as in GRPO's algorithm section.
    rollout_correction: str = DEFAULT_CORRECTION
    rollout_correction_cap: float = DEFAULT_CAP


@dataclasses.dataclass
class CriticConfig:
    path: str | None = None  # a model directory for the critic; null: a value head on the policy's model
    lr: float = 1e-5  # its own optimizer's learning rate (the schedule is engine.lr_schedule's)
    warmup_steps: int = 0  # the first N steps train the critic alone (the policy waits for sensible values)
    ppo_epochs: int | None = None  # passes over the step's mini-batches; null: train.ppo_epochs
    # Its own micro-batches per rank (values and updates): micro_batch_tokens (a token budget) else micro_batch_size
    # (sequences); both null: the policy's (train.micro_batch_tokens / train.micro_batch_size)
    micro_batch_size: int | None = None
    micro_batch_tokens: int | None = None
    param_offload: bool = False  # the critic's parameters in host memory outside its own passes
    optimizer_offload: bool = False  # and its optimizer state


@dataclasses.dataclass
class PPOConfig(RLConfig):
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
    critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)
    trainer: str = "ppo"


PRESETS: dict[str, dict] = {
    "default": {},
    "cpu-demo": {  # GRPO's demo task and model, with a critic
        "nproc": 2,
        "model": {"path": BUILTIN_MODEL},
        "data": {"task": "echo"},
        "rollout": {"n": 4, "temperature": 1.0, "max_new_tokens": 4},
        "critic": {"lr": 1e-3, "warmup_steps": 1},
        "train": {"steps": 200, "prompts_per_step": 16, "micro_batch_size": 16},
        "engine": {"fsdp_version": 2, "lr": 2e-3, "max_grad_norm": 1.0},
    },
}
