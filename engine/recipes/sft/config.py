"""``SFTConfig``: the schema, presets and checks of ``accel-sft``; the pipeline (preset, YAML file, ``key=value``
overrides) is the shared one of ``engine/train/config.py``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from accel_backends.names import did_you_mean

from ...config import EngineConfig
from ...sequence_parallel import config_problems
from ...train import config as train_config
from ...train.settings import RunConfig, TrainerConfig, missing_model, run_problems

DEMO_MODEL = "builtin:tiny-chat"  # a tiny Qwen2.5-like model directory, written on first use (engine.demo_model)
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
    "cpu-demo": {
        "nproc": 2,
        "model": {"path": DEMO_MODEL, "hidden_size": 64, "layers": 2},
        "data": {"max_length": 64, "demo_examples": 2048},
        "train": {"epochs": 2, "batch_size": 32, "micro_batch_tokens": 512},
        "run": {"val_every": 20},
        "engine": {"fsdp_version": 2, "lr": 3e-3, "lr_schedule": "cosine", "warmup_steps": 10,
                   "max_grad_norm": 1.0},
    },
    "h100": {
        "nproc": "auto",
        "model": {"path": None},
        "data": {"max_length": 4096},
        "train": {"batch_size": 128, "micro_batch_tokens": 16384},
        "engine": {"fsdp_version": 2, "lr": 1e-5, "lr_schedule": "cosine", "warmup_steps": 20,
                   "mixed_precision": "auto", "gradient_checkpointing": True},
    },
}
# Ascend 910B (64 GB HBM): the H100 settings with half the tokens per micro-batch.
PRESETS["ascend-910b"] = {**PRESETS["h100"], "train": {"batch_size": 128, "micro_batch_tokens": 8192}}


def build_config(preset: str | None, config_file: str | None, overrides: list[str]) -> SFTConfig:
    return train_config.build_config(SFTConfig, PRESETS, preset, config_file, overrides)


def engine_config(config: SFTConfig, total_steps: int | None = None) -> EngineConfig:
    """The engine's options: ``engine.*``, with the seed and (for the LR schedule) the run's optimizer steps."""
    defaults: dict[str, Any] = {"seed": config.train.seed}
    if total_steps is not None:
        defaults["total_steps"] = total_steps
    return train_config.engine_options(dict(config.engine), defaults)


def check(config: SFTConfig, world_size: int) -> list[str]:
    """Every problem that can be found from the options alone, as sentences (the data is checked next)."""
    problems = []
    d, t, r = config.data, config.train, config.run
    if config.model.path is None:
        problems.append(missing_model(config.preset))
    elif config.model.path != DEMO_MODEL:
        from ...train.model_dir import check_model_dir

        problems += check_model_dir(config.model.path)
    for key, path in (("data.path", d.path), ("data.val_path", d.val_path)):
        if path and not Path(path).exists():
            problems.append(f"{key} {path} does not exist")
    choices = (("data.format", d.format, FORMATS), ("data.truncation", d.truncation, TRUNCATIONS),
               ("data.empty_mask", d.empty_mask, ("error", "drop")), ("train.loss_on", t.loss_on, LOSS_ON))
    for key, value, allowed in choices:
        if value not in allowed:
            problems.append(f"{key} must be one of {', '.join(allowed)}, got {value!r}"
                            f"{did_you_mean(str(value), allowed, key + '=')}")
    if not 0 <= d.val_fraction < 1:
        problems.append(f"data.val_fraction must be in [0, 1), got {d.val_fraction}")
    for name, value in (("data.max_length", d.max_length), ("train.batch_size", t.batch_size),
                        ("train.micro_batch_size", t.micro_batch_size), ("data.demo_examples", d.demo_examples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{name} must be a positive integer, got {value!r}")
    for name, value in (("train.steps", t.steps), ("train.batch_tokens", t.batch_tokens),
                        ("train.micro_batch_tokens", t.micro_batch_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append(f"{name} must be a positive integer or null, got {value!r}")
    if not t.epochs > 0:
        problems.append(f"train.epochs must be > 0, got {t.epochs}")
    problems += run_problems(r)
    if problems:
        return problems
    if t.micro_batch_tokens is not None and t.micro_batch_tokens < d.max_length:
        problems.append(f"train.micro_batch_tokens={t.micro_batch_tokens} is below data.max_length={d.max_length}: "
                        f"an example of data.max_length tokens could never run; raise train.micro_batch_tokens to at "
                        f"least {d.max_length} or lower data.max_length")
    if t.batch_tokens is not None and t.batch_tokens < d.max_length:
        problems.append(f"train.batch_tokens={t.batch_tokens} is below data.max_length={d.max_length}: raise it "
                        f"to at least {d.max_length}")
    sp = config.engine.get("sequence_parallel_size", 1)
    if isinstance(sp, int) and not isinstance(sp, bool) and sp > 1:  # the rest of sp's checks: engine_config below
        problems += config_problems(sp, world_size)  # with the defaults: only whether sp divides the world
    groups = train_config.data_parallel_groups(config.engine, world_size)
    if t.batch_tokens is None and t.batch_size < groups:
        who = f"{groups} ranks" if groups == world_size else f"{groups} data-parallel groups"
        problems.append(f"train.batch_size={t.batch_size} sequences per step cannot give each of the {who} "
                        f"one: raise train.batch_size to at least {groups}")
    if str(config.engine.get("mixed_precision", "")) == "fp16":
        problems.append("engine.mixed_precision=fp16 is not supported (no loss scaling): use bf16 (or auto)")
    try:
        engine_config(config, config.train.steps or 1)  # the real count follows from the data
    except (ValueError, TypeError) as exc:
        problems.append(str(exc))
    return problems


def resolved(config: SFTConfig, derived: dict | None = None) -> dict:
    """Every option, every engine default, and the values that follow from the data (when known)."""
    data = config.to_dict()
    data["engine"] = dataclasses.asdict(engine_config(config, (derived or {}).get("total_steps")))
    if derived:
        data["derived"] = derived
    return data
