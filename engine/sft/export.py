"""``accel-sft export RUN_DIR|CHECKPOINT OUT [--lora merged|adapter]``: the shared export
(``engine/train/export.py``) of an SFT run; ``--lora adapter`` writes the adapters only (a PEFT directory)."""

from __future__ import annotations

from pathlib import Path

from ..train import export as shared
from .config import SFTConfig, engine_config


def run_config(run_dir: Path) -> SFTConfig:
    """The configuration an SFT run was started with (its ``config.json``)."""
    return shared.run_config(run_dir, SFTConfig, "accel-sft", "accel-grpo", trainer="sft")


def load_run(run_dir: Path) -> shared.RunModel:
    from .model import load_tokenizer

    config = run_config(run_dir)
    path = config.model.path
    return shared.RunModel(model_path=path, engine=engine_config(config, 1), build=lambda: (load_tokenizer(path), path))


def export(source, out, **options) -> dict:
    return shared.export(source, out, load_run, **options)


def main(argv: list[str]) -> int:
    return shared.main(argv, load_run, "accel-sft")
