"""``accel-sft export RUN_DIR|CHECKPOINT OUT [--lora merged|adapter]``: the shared export
(``engine/runs/export.py``) of an SFT run; ``--lora adapter`` writes the adapters only (a PEFT directory)."""

from __future__ import annotations

import json
from pathlib import Path

from ..runs import export as shared
from ..runs.export import ExportError
from .config import SFTConfig, engine_config


def run_config(run_dir: Path) -> SFTConfig:
    try:
        data = json.loads((run_dir / "config.json").read_text())
    except ValueError as exc:
        raise ExportError(f"{run_dir / 'config.json'} is not valid JSON: {exc}") from exc
    if data.get("trainer") != "sft":
        raise ExportError(f"{run_dir} is not an accel-sft run (an accel-grpo run? use accel-grpo export)")
    try:
        return SFTConfig.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ExportError(f"{run_dir / 'config.json'} is not a readable accel-sft config: {exc}") from exc


def load_run(run_dir: Path) -> shared.RunModel:
    from .model import load_tokenizer

    config = run_config(run_dir)
    path = config.model.path
    return shared.RunModel(model_path=path, engine=engine_config(config, 1), build=lambda: (load_tokenizer(path), path))


def export(source, out, **options) -> dict:
    return shared.export(source, out, load_run, **options)


def main(argv: list[str]) -> int:
    return shared.main(argv, load_run, "accel-sft")
