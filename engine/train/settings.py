"""The config sections every trainer shares, written once: the model (``model.*``) and the run (``run.*``).

The defaults are the library's, for a user's own model and data; the demo's settings live in each recipe's
``cpu-demo`` preset. A run that is interrupted (Ctrl-C, a scheduler's SIGTERM) finishes its step and saves it.
"""

from __future__ import annotations

import dataclasses

from .config import ConfigRoot


@dataclasses.dataclass
class ModelConfig:
    path: str | None = None  # a local Hugging Face model directory (or a recipe's built-in demo model)
    hidden_size: int = 64  # the built-in demo model's size (ignored for a directory)
    layers: int = 2  # the built-in demo model's layers (ignored for a directory)


@dataclasses.dataclass
class RunConfig:
    name: str | None = None  # default: <trainer>-<preset>-<date>-<time>
    output_dir: str = "runs"  # where run directories go
    save_every: int = 0  # checkpoint every N steps (0: only at the end)
    keep_checkpoints: int | None = None  # keep only the newest N complete checkpoints (null: keep every one)
    val_every: int = 0  # validate every N steps and after the last (0: only after the last, when there is a set)
    loggers: list = dataclasses.field(default_factory=lambda: ["jsonl"])  # jsonl, tensorboard, wandb, mlflow
    progress: bool = True  # rank 0's progress on stderr: a bar on a terminal, a line every few steps in a log
    resume_fallback: bool = True  # --resume: a damaged newest checkpoint: the newest every rank can load (warning)
    save_on_interrupt: bool = True  # Ctrl-C / SIGTERM: finish the step and checkpoint it before stopping
    overwrite: bool = False  # start anew under an existing run.name: the old run is moved aside, never deleted


@dataclasses.dataclass
class TrainerConfig(ConfigRoot):
    """The first fields of every trainer's config root, written once; a recipe's root adds its own sections (and
    ``run``, ``engine`` and ``trainer``, which stay last in config.json) after these."""

    preset: str = "default"  # the preset applied first (--preset)
    nproc: int | str = "auto"  # worker processes on this node; auto: one per visible accelerator (2 on the CPU)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)


def run_problems(run: RunConfig) -> list[str]:
    """The ``run.*`` options' problems (both trainers check them alike)."""
    from accel_backends.names import did_you_mean

    from .loggers import LOGGERS

    problems = []
    for name in run.loggers:
        if name not in LOGGERS:
            problems.append(f"run.loggers: unknown logger {name!r}{did_you_mean(str(name), LOGGERS)}; choose from "
                            f"{', '.join(LOGGERS)} (metrics.jsonl is always written)")
    keep = run.keep_checkpoints
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        problems.append(f"run.keep_checkpoints must be a positive integer (keep the newest N complete checkpoints) "
                        f"or null (keep all), got {keep!r}")
    if run.save_every < 0 or run.val_every < 0:
        problems.append("run.save_every and run.val_every must be >= 0")
    for name in ("resume_fallback", "save_on_interrupt", "progress", "overwrite"):
        if not isinstance(getattr(run, name), bool):
            problems.append(f"run.{name} must be true or false, got {getattr(run, name)!r}")
    return problems


def missing_model(preset: str) -> str:
    """The problem of a run with no ``model.path`` (the demo presets set their own model)."""
    if preset == "default":
        return ("model.path=/local/path/to/hf-model is needed with your own data (no downloads here); give neither "
                "model.path nor data.path for the CPU demo")
    return f"preset {preset} needs model.path=/local/path/to/hf-model (no downloads here)"
