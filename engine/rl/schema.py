"""The config sections every RL recipe shares (its schema adds its own ``algorithm`` section): the prompt data and
rewards (``data.*``), the rollout (``rollout.*``), the step's sizes (``train.*``) and the RL run's outputs
(``run.*`` beyond the frame's), in the config root ``RLConfig`` that a recipe's root derives from (GRPO's:
``engine/rl/algorithms/grpo/schema.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..rollout.engines.vllm_settings import VLLMConfig
from ..train.settings import RunConfig as SharedRunConfig
from ..train.settings import TrainerConfig
from .reward_model import RewardModelConfig


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
class RLConfig(TrainerConfig):
    """An RL recipe's config root: the shared sections in config.json's order. A recipe's root derives from it and
    sets ``algorithm`` (its own section, a dataclass with at least ``rollout_correction`` and
    ``rollout_correction_cap``: the step weighs corrected terms with them) and ``trainer`` (its name); a field set
    again keeps its place."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    algorithm: Any = None
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    reward_model: RewardModelConfig = dataclasses.field(default_factory=RewardModelConfig)  # reward_model.py
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)  # EngineConfig fields
    trainer: str = ""  # recorded in config.json: export / eval know which trainer's schema reads it
