"""GRPO's learning curves (the RL layer's, ``engine/rl/recipe.py``); the metrics file and the plotting are shared
(``engine/train/report.py``)."""

from __future__ import annotations

from pathlib import Path

from ...rl.recipe import CURVES  # noqa: F401  (GRPO's curves are the RL layer's)
from ...train import report
from ...train.report import MetricsLog, read_metrics  # noqa: F401  (the names GRPO's modules and tests use)


def panels(rows: list[dict]) -> list[tuple[str, str]]:
    return report.panels(rows, CURVES)


def plot_curves(metrics_path: Path, png_path: Path) -> None:
    report.plot_curves(metrics_path, png_path, CURVES)
