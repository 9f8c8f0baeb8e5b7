"""What the offline recipes' configs (SFT, DPO, reward models) share: the engine's options, config.json's content,
and the checks of the model, the paths and the batch sizes, one sentence per problem."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..config import EngineConfig
from ..sequence_parallel import config_problems
from ..train import config as train_config
from ..train.settings import missing_model, run_problems
from .model_files import DEMO_MODEL


def accelerator_presets(*, max_length: int, batch_size: int, micro_batch_tokens: int, lr: float,
                        warmup_steps: int) -> dict[str, dict]:
    """An offline trainer's ``h100`` preset (80 GB HBM: a user's model and data, bf16 where the device has it,
    gradient checkpointing) and its ``ascend-910b`` twin (64 GB HBM: half the tokens per micro-batch)."""
    h100 = {"nproc": "auto", "model": {"path": None}, "data": {"max_length": max_length},
            "train": {"batch_size": batch_size, "micro_batch_tokens": micro_batch_tokens},
            "engine": {"fsdp_version": 2, "lr": lr, "lr_schedule": "cosine", "warmup_steps": warmup_steps,
                       "mixed_precision": "auto", "gradient_checkpointing": True}}
    return {"h100": h100, "ascend-910b": {**h100, "train": {"batch_size": batch_size,
                                                            "micro_batch_tokens": micro_batch_tokens // 2}}}


def engine_config(config, total_steps: int | None = None) -> EngineConfig:
    """The engine's options: ``engine.*``, with the seed and (for the LR schedule) the run's optimizer steps."""
    defaults: dict[str, Any] = {"seed": config.train.seed}
    if total_steps is not None:
        defaults["total_steps"] = total_steps
    return train_config.engine_options(dict(config.engine), defaults)


def resolved(config, derived: dict | None = None) -> dict:
    """Every option, every engine default, and the values that follow from the data (when known)."""
    data = config.to_dict()
    data["engine"] = dataclasses.asdict(engine_config(config, (derived or {}).get("total_steps")))
    if derived:
        data["derived"] = derived
    return data


def positive(name: str, value, optional: bool = False) -> list[str]:
    """``name`` must be a positive integer (or null when ``optional``)."""
    if optional and value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return [f"{name} must be a positive integer{' or null' if optional else ''}, got {value!r}"]
    return []


def input_problems(config) -> list[str]:
    """The model directory and the data files."""
    problems = []
    if config.model.path is None:
        problems.append(missing_model(config.preset))
    elif config.model.path != DEMO_MODEL:
        from ..train.model_dir import check_model_dir

        problems += check_model_dir(config.model.path)
    for key, path in (("data.path", config.data.path), ("data.val_path", config.data.val_path)):
        if path and not Path(path).exists():
            problems.append(f"{key} {path} does not exist")
    if not 0 <= config.data.val_fraction < 1:
        problems.append(f"data.val_fraction must be in [0, 1), got {config.data.val_fraction}")
    return problems


def size_problems(config, demo_key: str) -> list[str]:
    """The shared ``data`` and ``train`` sizes and the ``run`` section, one sentence each: positive integers (the
    token budgets and ``train.steps`` may be null), ``train.epochs`` above 0. ``demo_key``: the ``data`` key that
    sizes the built-in demo set (``demo_examples``, ``demo_pairs``)."""
    d, t = config.data, config.train
    problems = []
    for name, value in (("data.max_length", d.max_length), ("train.batch_size", t.batch_size),
                        ("train.micro_batch_size", t.micro_batch_size), (f"data.{demo_key}", getattr(d, demo_key))):
        problems += positive(name, value)
    for name, value in (("train.steps", t.steps), ("train.batch_tokens", t.batch_tokens),
                        ("train.micro_batch_tokens", t.micro_batch_tokens)):
        problems += positive(name, value, optional=True)
    if not t.epochs > 0:
        problems.append(f"train.epochs must be > 0, got {t.epochs}")
    return problems + run_problems(config.run)


def sizing_problems(config, world_size: int, *, unit_tokens: int, limit: str, unit: str, items: str) -> list[str]:
    """The batch sizes against the largest item (``unit``, of ``unit_tokens`` tokens; ``limit``: those tokens as the
    user's options say them), the ranks and the engine's options; ``items``: what ``train.batch_size`` counts."""
    problems = []
    t = config.train
    if t.micro_batch_tokens is not None and t.micro_batch_tokens < unit_tokens:
        problems.append(f"train.micro_batch_tokens={t.micro_batch_tokens} is below {limit}: {unit} could never run; "
                        f"raise train.micro_batch_tokens to at least {unit_tokens} or lower data.max_length")
    if t.batch_tokens is not None and t.batch_tokens < unit_tokens:
        problems.append(f"train.batch_tokens={t.batch_tokens} is below {limit}: raise it to at least {unit_tokens}")
    sp = config.engine.get("sequence_parallel_size", 1)
    if isinstance(sp, int) and not isinstance(sp, bool) and sp > 1:  # the rest of sp's checks: engine_config below
        problems += config_problems(sp, world_size)  # with the defaults: only whether sp divides the world
    groups = train_config.data_parallel_groups(config.engine, world_size)
    if t.batch_tokens is None and t.batch_size < groups:
        who = f"{groups} ranks" if groups == world_size else f"{groups} data-parallel groups"
        problems.append(f"train.batch_size={t.batch_size} {items} per step cannot give each of the {who} one: "
                        f"raise train.batch_size to at least {groups}")
    if str(config.engine.get("mixed_precision", "")) == "fp16":
        problems.append("engine.mixed_precision=fp16 is not supported (no loss scaling): use bf16 (or auto)")
    try:
        engine_config(config, t.steps or 1)  # the real count follows from the data
    except (ValueError, TypeError) as exc:
        problems.append(str(exc))
    return problems


def demo_preset(*, data: dict, train: dict, run: dict, engine: dict) -> dict:
    """An offline trainer's ``cpu-demo`` preset: 2 processes, the tiny demo model, sequences of 64 tokens, FSDP2."""
    return {"nproc": 2, "model": {"path": DEMO_MODEL, "hidden_size": 64, "layers": 2},
            "data": {"max_length": 64, **data}, "train": train, "run": run, "engine": {"fsdp_version": 2, **engine}}


def command_help(tool: str, run_args: str, *, preset_extra: str = "", export_to: str = "/models/NAME-hf",
                 export_what: str = "a checkpoint as a Hugging Face model directory", doc: str) -> str:
    """The examples and the closing lines of an offline trainer's ``--help`` (they differ only in these words)."""
    name = tool.removeprefix("accel-")
    lines = [tool.ljust(48) + "# the CPU demo", f"{tool} {run_args}", f"{tool} --preset h100 {run_args}{preset_extra}",
             f"{tool} --resume run.name={name}-cpu-demo-20261201-101500",
             f"{tool} export runs/NAME {export_to}".ljust(48) + f"# {export_what}",
             f"{tool} eval runs/NAME data.val_path=val.jsonl"]
    return ("examples:\n" + "".join(f"  {line}\n" for line in lines) + "\nCtrl-C or SIGTERM finishes the current step, "
            f"saves it and stops; the last line says how to resume.\nOptions, data formats and metrics: {doc}.\n")
