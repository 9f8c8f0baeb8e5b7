"""GRPO's config schema (the RL layer's shared sections, ``engine/rl/schema.py``, and its own ``algorithm.*``) and
presets. The defaults are the library's, for a user's own model and data (``default``); ``cpu-demo`` is the
demo's, ``h100`` and ``ascend-910b`` starting points on accelerators. The pipeline, sizes and checks are in
``config.py``."""

from __future__ import annotations

import dataclasses

from ...model import BUILTIN_MODEL
from ...rollout_correction import DEFAULT_CAP, DEFAULT_CORRECTION
from ...schema import DataConfig, RLConfig, RolloutConfig, RunConfig, TrainConfig  # noqa: F401  (by their usual names)
from .loss_types import DEFAULT_LOSS_TYPE


@dataclasses.dataclass
class AlgorithmConfig:
    # A named recipe (engine/rl/algorithms/grpo/loss_types.py): grpo, dapo, dr_grpo, bnpo, gspo or cispo. It fills
    # scale_rewards, loss_agg, clip_low and clip_high where left null; a value given explicitly wins.
    loss_type: str = DEFAULT_LOSS_TYPE
    # The advantage estimator (docs/algorithms.md): grpo (group-relative), rloo (leave-one-out baseline),
    # reinforce_pp (REINFORCE++: per-token returns normalised over the global batch) or reinforce_pp_baseline.
    advantage: str = "grpo"
    # Several reward functions: sum_then_normalize (their weighted sum is the score) or normalize_then_sum (GDPO:
    # each normalised in its group first).
    multi_reward: str = "sum_then_normalize"
    gamma: float = 1.0  # reinforce_pp's discount over the response's tokens
    kl_reward_coef: float = 0.0  # reinforce_pp*: > 0 folds -coef x the k1 KL to the reference into each token's reward
    scale_rewards: str | None = None  # grpo's advantages divided by the std of the group, of the batch, or none
    loss_agg: str | None = None  # aggregation mode (algorithms.AGGREGATION_MODES)
    clip_low: float | None = None
    clip_high: float | None = None
    clip_c: float | None = None  # dual clipping for negative advantages (> 1)
    loss_norm_length: int | None = None  # seq-mean-token-sum-norm's constant; null: rollout.max_new_tokens
    entropy_coeff: float = 0.0  # > 0 subtracts entropy_coeff x the aggregated token entropy from the loss
    kl_loss_coef: float = 0.0  # > 0 adds a KL loss to a frozen reference model (verl's kl_loss_coef, TRL's beta)
    kl_kind: str = "k3"
    ref_param_offload: bool = True  # keep the reference model in host memory between uses
    filter_groups: bool = False  # DAPO dynamic sampling: drop groups whose rewards are all equal, draw more
    max_gen_batches: int = 10  # with filter_groups: at most this many draws per step
    mask_truncated: bool = False  # responses cut at rollout.max_new_tokens get no loss
    overlong_buffer_len: int = 0  # DAPO's soft overlong penalty over the last N tokens allowed (0: off)
    overlong_penalty_factor: float = 1.0  # the penalty at rollout.max_new_tokens
    # Importance sampling against the rollout engine's own log-probs (engine/rl/rollout_correction.py): none,
    # token_truncate, token_mask, sequence_truncate, sequence_mask, band or seq_geo_mask, with the ratio's cap
    # (the band's upper edge: [1/cap, cap]).
    rollout_correction: str = DEFAULT_CORRECTION
    rollout_correction_cap: float = DEFAULT_CAP
    norm_by_std: bool | None = None  # deprecated: scale_rewards (true: group, false: none)
    kl_coef: float | None = None  # deprecated name of kl_loss_coef


@dataclasses.dataclass
class GRPOConfig(RLConfig):
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
    trainer: str = "grpo"


PRESETS: dict[str, dict] = {
    "default": {},  # the schema's own values: the library defaults, for a user's model and data
    "cpu-demo": {
        "nproc": 2,
        "model": {"path": BUILTIN_MODEL},
        "data": {"task": "echo"},
        "rollout": {"n": 8, "temperature": 1.0, "max_new_tokens": 4},
        "algorithm": {"kl_loss_coef": 0.001, "ref_param_offload": True},
        "train": {"steps": 200, "prompts_per_step": 16, "micro_batch_size": 16},
        "engine": {"fsdp_version": 2, "lr": 2e-3, "max_grad_norm": 1.0},
    },
}


def _accelerator_preset(micro_batch_tokens: int) -> dict:
    """Real models on GPUs/NPUs: a local model and GSM8K data are required (model.path=, data.path=).

    The token budget bounds each micro-batch as the former 8 (H100) or 4 (910B) sequences of at most 512 prompt and
    512 response tokens did; packed, a micro-batch holds as many sequences as fit.
    """
    return {
        "nproc": "auto",
        "model": {"path": None},
        "data": {"task": "gsm8k", "path": None, "max_prompt_tokens": 512},
        "rollout": {"n": 8, "temperature": 1.0, "max_new_tokens": 512},
        "algorithm": {"kl_loss_coef": 0.001, "ref_param_offload": True},
        "train": {"steps": 200, "prompts_per_step": 64, "micro_batch_tokens": micro_batch_tokens},
        "engine": {"fsdp_version": 2, "lr": 1e-6, "mixed_precision": "auto", "gradient_checkpointing": True},
    }


PRESETS["h100"] = _accelerator_preset(micro_batch_tokens=8192)  # 80 GB HBM
PRESETS["ascend-910b"] = _accelerator_preset(micro_batch_tokens=4096)  # 64 GB HBM
