"""A GRPO run's checkpoint as a Hugging Face model directory: the frame's export (``engine/train/export.py``) with
the ``grpo`` recipe's model (``accel-grpo eval`` exports a run's checkpoint through it)."""

from __future__ import annotations

from pathlib import Path

from ....train import export as shared
from ....train.export import ExportError, locate  # noqa: F401  (accel-grpo eval uses them from here)


def run_config(run_dir: Path):
    """The configuration a GRPO run was started with (its ``config.json``)."""
    from ....train.registry import get_recipe

    return shared.read_run_config(run_dir, get_recipe("grpo"))


def load_run(run_dir: Path) -> shared.RunModel:
    from ....train.registry import get_recipe

    return get_recipe("grpo").run_model(run_config(run_dir))


def export(source, out, **options) -> dict:
    return shared.export(source, out, load_run, **options)
