"""``accel-grpo export RUN_DIR|CHECKPOINT OUT``: the shared export (``engine/runs/export.py``) of a GRPO run, whose
``config.json`` is a ``GRPOConfig``."""

from __future__ import annotations

import json
from pathlib import Path

from ..runs import export as shared
from ..runs.export import ExportError, locate  # noqa: F401  (accel-grpo eval uses them from here)
from .config import GRPOConfig, engine_config
from .model import BUILTIN_MODEL, build_model


def run_config(run_dir: Path) -> GRPOConfig:
    """The configuration a run was started with (its ``config.json``)."""
    try:
        data = json.loads((run_dir / "config.json").read_text())
    except ValueError as exc:
        raise ExportError(f"{run_dir / 'config.json'} is not valid JSON: {exc}") from exc
    if data.get("trainer") == "sft":
        raise ExportError(f"{run_dir} is an accel-sft run: use accel-sft export (or accel-sft eval)")
    try:
        return GRPOConfig.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ExportError(f"{run_dir / 'config.json'} is not a readable accel-grpo config: {exc}") from exc


def load_run(run_dir: Path) -> shared.RunModel:
    config = run_config(run_dir)
    return shared.RunModel(model_path=None if config.model.path == BUILTIN_MODEL else config.model.path,
                           engine=engine_config(config, world_size=1), build=lambda: build_model(config.model))


def export(source, out, **options) -> dict:
    return shared.export(source, out, load_run, **options)


def main(argv: list[str]) -> int:
    return shared.main(argv, load_run, "accel-grpo")
