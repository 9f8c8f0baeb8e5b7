"""GRPO's learning curves (the RL layer's, ``engine/rl/recipe.py``, titled by its loss terms); the metrics file
and the plotting are shared (``engine/train/report.py``)."""

from __future__ import annotations

from pathlib import Path

from ....train import report
from ....train.report import MetricsLog, read_metrics  # noqa: F401  (the names GRPO's modules and tests use)
from ...recipe import CURVES


def curves_for(algorithm) -> tuple[tuple[str, str], ...]:
    """``CURVES`` with the loss panel titled by the terms the run's loss has (the KL and entropy terms only when
    their coefficients are set) and the KL panel only when there is a KL term."""
    terms = ["policy"] + ["KL"] * bool(algorithm.kl_loss_coef) + ["entropy bonus"] * bool(algorithm.entropy_coeff)
    title = f"loss ({' + '.join(terms)})"
    return tuple((key, title if key == "loss" else name) for key, name in CURVES
                 if key != "kl" or algorithm.kl_loss_coef)


def panels(rows: list[dict]) -> list[tuple[str, str]]:
    return report.panels(rows, CURVES)


def plot_curves(metrics_path: Path, png_path: Path) -> bool:
    return report.plot_curves(metrics_path, png_path, CURVES)
