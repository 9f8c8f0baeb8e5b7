"""``SFTConfig``: the schema, presets and checks of ``accel-sft``; the pipeline (preset, YAML file, ``key=value``
overrides) is the shared one of ``engine/train/config.py``."""

from __future__ import annotations

import dataclasses
from typing import Any

from accel_backends.names import not_one_of

from ....train import config as train_config
from ....train.settings import RunConfig, TrainerConfig
from ...run_config import accelerator_presets, demo_preset, input_problems, size_problems, sizing_problems

FORMATS = ("auto", "text", "messages", "prompt_completion")
TRUNCATIONS = ("keep_start", "drop", "error")
LOSS_ON = ("auto", "assistant", "completion", "all")


@dataclasses.dataclass
class DataConfig:
    path: str | None = None  # JSONL, JSON, Parquet file or a datasets save_to_disk directory; null: the demo task
    format: str = "auto"  # auto (from the columns; the choice is printed), text, messages or prompt_completion
    text_key: str = "text"  # the column of plain text (data.format=text)
    messages_key: str = "messages"  # the column of a conversation: a list of {"role", "content"} messages
    prompt_key: str = "prompt"  # prompt_completion: the prompt column (text or messages)
    completion_key: str = "completion"  # prompt_completion: the completion column (text or messages)
    tools_key: str = "tools"  # a row's tool schemas, passed to the chat template when present
    max_length: int = 1024  # tokens per example
    truncation: str = "keep_start"  # longer examples: keep_start (cut the end), drop (count them), error
    empty_mask: str = "error"  # an example with no supervised token: error (naming the row) or drop (counted)
    val_path: str | None = None  # held-out examples for validation (the same formats as data.path)
    val_fraction: float = 0.0  # or hold out this share of data.path; data.val_path wins (the demo task: 3%)
    demo_examples: int = 2048  # the demo task's size


@dataclasses.dataclass
class TrainConfig:
    loss_on: str = "auto"  # assistant (conversations), completion (prompt-completion), all; auto: by format
    epochs: float = 1.0  # passes over the training examples (fractions allowed), unless train.steps is set
    steps: int | None = None  # optimizer steps; null: as many as data.epochs passes over the data make
    batch_size: int = 16  # sequences per optimizer step over ALL ranks (whatever the world size)
    batch_tokens: int | None = None  # or: sequences per step until their tokens reach this (replaces batch_size)
    micro_batch_tokens: int | None = None  # tokens per micro-batch per rank (only splits the step's batch)
    micro_batch_size: int = 16  # sequences per micro-batch per rank, when micro_batch_tokens is not set
    padding_free: bool = True  # pack each micro-batch in one row where the model keeps sequences apart
    seed: int = 0  # shuffling (each epoch its own order) and the engine's seed


@dataclasses.dataclass
class SFTConfig(TrainerConfig):
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)
    trainer: str = "sft"  # recorded in config.json: export / eval know which schema reads it


PRESETS: dict[str, dict] = {
    "default": {"engine": {"lr_schedule": "cosine"}},  # the library defaults, for a user's model and data
    "cpu-demo": demo_preset(data={"demo_examples": 2048},
                            train={"epochs": 2, "batch_size": 32, "micro_batch_tokens": 512}, run={"val_every": 20},
                            engine={"lr": 3e-3, "lr_schedule": "cosine", "warmup_steps": 10, "max_grad_norm": 1.0}),
    **accelerator_presets(max_length=4096, batch_size=128, micro_batch_tokens=16384, lr=1e-5, warmup_steps=20),
}


def build_config(preset: str | None, config_file: str | None, overrides: list[str]) -> SFTConfig:
    return train_config.build_config(SFTConfig, PRESETS, preset, config_file, overrides)


def check(config: SFTConfig, world_size: int) -> list[str]:
    """Every problem that can be found from the options alone, as sentences (the data is checked next)."""
    d, t = config.data, config.train
    problems = input_problems(config)
    choices = (("data.format", d.format, FORMATS), ("data.truncation", d.truncation, TRUNCATIONS),
               ("data.empty_mask", d.empty_mask, ("error", "drop")), ("train.loss_on", t.loss_on, LOSS_ON))
    for key, value, allowed in choices:
        if value not in allowed:
            problems.append(not_one_of(key, value, allowed))
    problems += size_problems(config, "demo_examples")
    if problems:
        return problems
    return sizing_problems(config, world_size, unit_tokens=d.max_length, limit=f"data.max_length={d.max_length}",
                           unit="an example of data.max_length tokens", items="sequences")
