"""GRPO's config schema (its sections as dataclasses) and presets. The defaults are the library's, for a user's own
model and data (``default``); ``cpu-demo`` is the demo's, ``h100`` and ``ascend-910b`` starting points on
accelerators. The pipeline, sizes and checks are in ``config.py``."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...rl.model import BUILTIN_MODEL
from ...rl.reward_model import RewardModelConfig
from ...rl.rollout_correction import DEFAULT_CAP, DEFAULT_CORRECTION
from ...rollout.engines.vllm_settings import VLLMConfig
from ...train.settings import RunConfig as SharedRunConfig
from ...train.settings import TrainerConfig
from .loss_types import DEFAULT_LOSS_TYPE


@dataclasses.dataclass
class DataConfig:
    task: str = "gsm8k"  # gsm8k (the GSM8K answer check as the default reward) or echo (the demo's synthetic task)
    path: str | None = None  # JSONL, JSON, Parquet file or a datasets save_to_disk directory
    val_path: str | None = None  # held-out prompts for validation
    val_fraction: float = 0.0  # or hold out this share of data.path
    prompt_key: str | None = None  # default: prompt, question or problem (the first present)
    answer_key: str | None = None  # default: reward_model.ground_truth, answer, solution or ground_truth
    reward: str | list | None = None  # module:function (or a list); default: the task's own reward
    reward_weights: list | None = None  # one per reward function; default 1.0 each
    reward_style: str = "auto"  # auto (from the signature), simple, verl or trl
    chat_template: str = "auto"  # auto: apply the tokenizer's chat template when it has one; none
    system_prompt: str | None = None
    max_prompt_tokens: int | None = None  # longer prompts are dropped before training


@dataclasses.dataclass
class RolloutConfig:
    n: int = 8  # samples per prompt (the group size)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 512
    val_n: int = 1  # samples per validation prompt
    val_temperature: float = 0.0  # 0: greedy
    engine: str = "hf-continuous"  # the rollout engine: hf, hf-continuous, vllm, or one a plugin registers
    vllm: VLLMConfig = dataclasses.field(default_factory=VLLMConfig)  # rollout.engine=vllm's settings
    # Asynchronous training (vLLM servers): samples at most this many weight versions older than the policy they
    # train; 0: synchronous (sample, update, push). partial: a push lets in-flight requests go on with the new
    # weights (pause mode keep) instead of finishing them on the old ones first (wait).
    max_staleness: int = 0
    partial: bool = False
    # Multi-turn rollouts with tools (docs/agents.md): set either or both to turn them on.
    tools: list | None = None  # "module:function" names of tools the model may call
    environment: str | None = None  # "module:Class": one instance per trajectory, its public methods are tools
    max_tool_calls: int = 8  # per trajectory; a turn that would exceed it is the trajectory's answer
    max_tool_response_tokens: int = 256  # each tool result is cut to this many tokens
    tool_timeout_s: float = 30.0  # a call still running after this gets an error as its result
    max_parallel_tool_calls: int = 8  # tool calls running at once (those of one round run concurrently)


@dataclasses.dataclass
class AlgorithmConfig:
    # A named recipe (engine/grpo/loss_types.py): grpo, dapo, dr_grpo, bnpo, gspo or cispo. It fills the four keys
    # below that are left null; a value given explicitly wins.
    loss_type: str = DEFAULT_LOSS_TYPE
    scale_rewards: str | None = None  # advantages divided by the std of the group, of the batch, or none
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
    # Importance sampling against the rollout engine's own log-probs (engine/grpo/rollout_correction.py): none,
    # token_truncate, token_mask, sequence_truncate or sequence_mask, with the ratio's cap.
    rollout_correction: str = DEFAULT_CORRECTION
    rollout_correction_cap: float = DEFAULT_CAP
    norm_by_std: bool | None = None  # deprecated: scale_rewards (true: group, false: none)
    kl_coef: float | None = None  # deprecated name of kl_loss_coef


@dataclasses.dataclass
class TrainConfig:
    steps: int = 40
    prompts_per_step: int = 16  # over all ranks
    prompts_per_update: int | None = None  # over all ranks, with their rollout.n responses; null: one update per step
    ppo_epochs: int = 1
    mini_batch_size: int | None = None  # deprecated: sequences per rank per update (use prompts_per_update)
    micro_batch_size: int = 16  # sequences per micro-batch per rank, when micro_batch_tokens is not set
    micro_batch_tokens: int | None = None  # tokens (prompt + response) per micro-batch per rank; replaces the count
    padding_free: bool = True  # pack each micro-batch's sequences in one row (no pad tokens) where the model can
    seed: int = 0


@dataclasses.dataclass
class RunConfig(SharedRunConfig):
    log_samples: int = 1  # prompts per step written with their responses and rewards to samples.jsonl (0: none)
    val_before_train: bool | None = None  # a baseline validation before step 1; null: when there is a validation set


@dataclasses.dataclass
class GRPOConfig(TrainerConfig):
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    reward_model: RewardModelConfig = dataclasses.field(default_factory=RewardModelConfig)  # engine/rl/reward_model.py
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)  # EngineConfig fields
    trainer: str = "grpo"  # recorded in config.json: export / eval know which trainer's schema reads it


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
