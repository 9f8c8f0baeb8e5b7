"""``accel-grpo export RUN_DIR|CHECKPOINT OUT``: the shared export (``engine/train/export.py``) of a GRPO run, whose
``config.json`` is a ``GRPOConfig``."""

from __future__ import annotations

from pathlib import Path

from ..train import export as shared
from ..train.export import ExportError, locate  # noqa: F401  (accel-grpo eval uses them from here)
from .config import GRPOConfig, engine_config
from .model import BUILTIN_MODEL, build_model


def run_config(run_dir: Path) -> GRPOConfig:
    """The configuration a run was started with (its ``config.json``)."""
    return shared.run_config(run_dir, GRPOConfig, "accel-grpo", "accel-sft", trainer=None)


def load_run(run_dir: Path) -> shared.RunModel:
    config = run_config(run_dir)
    return shared.RunModel(model_path=None if config.model.path == BUILTIN_MODEL else config.model.path,
                           engine=engine_config(config, world_size=1), build=lambda: build_model(config.model))


def export(source, out, **options) -> dict:
    return shared.export(source, out, load_run, **options)


def main(argv: list[str]) -> int:
    return shared.main(argv, load_run, "accel-grpo")
