"""Rank 0's outputs: one JSON line of metrics per step, and a PNG of the learning curves (each trainer names its
curves)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..runtime import OneLineError


class MetricsLog:
    """``metrics.jsonl``; on resume, lines from steps after the checkpoint are dropped (they will be redone).
    ``create=False`` (``samples.jsonl``): the file appears with its first line, so a run that logs none leaves
    no empty file."""

    def __init__(self, path: Path, resume_step: int, create: bool = True) -> None:
        self.path = path
        kept = []
        if resume_step and path.exists():
            kept = [line for line, row in _rows_of(path) if row["step"] <= resume_step]
        if kept or create:
            path.write_text("".join(line + "\n" for line in kept))
        else:
            path.unlink(missing_ok=True)

    def write(self, metrics: dict) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(metrics) + "\n")


class DamagedMetrics(OneLineError, ValueError):
    """A line inside ``metrics.jsonl`` (not its last) is not JSON: the run's record is damaged, not cut short."""


def _rows_of(path: Path) -> list[tuple[str, dict]]:
    """``(line, row)`` of each line of ``metrics.jsonl``. A run killed while writing leaves its last line cut: that
    line is dropped with a note (the resumed run writes that step again); a damaged line before it is refused."""
    lines = [(number, line) for number, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    rows = []
    for index, (number, line) in enumerate(lines):
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "step" not in row:
                raise ValueError("not a row of metrics")
        except ValueError as exc:
            if index < len(lines) - 1:
                raise DamagedMetrics(f"{path} line {number} is not JSON ({exc}): the run's record is damaged; "
                                     "repair or remove that line, then resume") from None
            print(f"note: {path}: its last line was cut short (the run stopped while writing it): dropped, the "
                  "resumed run writes that step again", file=sys.stderr, flush=True)
            continue
        rows.append((line, row))
    return rows


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def first_and_last(values: list[float], window: int = 10) -> str:
    """The end summary's comparison: the mean over the first and over the last ``window`` steps, windows that
    never overlap (a short run compares its first and last halves; one step is said as it is)."""
    if len(values) == 1:
        return f"at its only step {values[0]:.3f}"
    size = max(1, min(window, len(values) // 2))
    first, last = values[:size], values[-size:]
    steps = "step" if size == 1 else f"{size} steps"
    return f"over the first {steps} {sum(first) / size:.3f}, over the last {steps} {sum(last) / size:.3f}"


def panels(rows: list[dict], curves) -> list[tuple[str, str]]:
    """The ``(key, title)`` curves that have data: the validation ones only for a run that validated."""
    return [(key, title) for key, title in curves if any(key in row for row in rows)]


def pyplot(what: str, where: Path):
    """``matplotlib.pyplot`` on its file-only backend, or ``None`` after a one-line note on stderr: plots are
    optional (a GPU image often lacks matplotlib, and nothing may be installable there), the figures never are."""
    try:
        import matplotlib
    except ImportError:
        print(f"{what} not drawn: matplotlib is not installed (pip install matplotlib); the figures are in {where}",
              file=sys.stderr, flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(metrics_path: Path, png_path: Path, curves) -> bool:
    """One panel per curve of ``curves`` that has data, three to a row; whether it drew them (not without
    matplotlib, nor for a run without metrics)."""
    rows = read_metrics(metrics_path)
    if not rows:
        return False
    plt = pyplot("curves", metrics_path)
    if plt is None:
        return False
    shown = panels(rows, curves)
    grid_rows = -(-len(shown) // 3)
    figure, axes = plt.subplots(grid_rows, 3, figsize=(12, 3.2 * grid_rows), squeeze=False)
    for axis in axes.flat[len(shown):]:
        axis.remove()
    for axis, (key, title) in zip(axes.flat, shown, strict=False):
        points = [(row["step"], row[key]) for row in rows if key in row]  # validation rows are sparse
        axis.plot(*zip(*points, strict=False), lw=1.5, marker="o" if len(points) < 20 else None)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    figure.suptitle(metrics_path.parent.name)
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return True
