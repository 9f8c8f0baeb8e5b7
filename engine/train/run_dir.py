"""A run's directory: ``<run.output_dir>/<run.name>``, or ``<trainer>-<preset>-<date>-<time>``; ``--resume`` finds
the newest run of the trainer and preset (also one named before names carried the trainer); under torchrun every
node must name it. And the line that says how to continue a run."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .. import checkpoint

TRACEBACKS = "tracebacks.txt"  # in the run (or eval) directory: the workers' tracebacks when one failed


def run_dir(config, resume: bool, trainer: str | None = None) -> Path:
    """``trainer`` prefixes a run's generated name (``grpo-cpu-demo-...``) so that trainers' runs differ; --resume
    without a name also finds a run named before the prefix (``cpu-demo-...``) when there is no newer one."""
    from ..runtime import under_launcher

    root = Path(config.run.output_dir)
    if config.run.name:
        return root / config.run.name
    prefix = f"{trainer}-{config.preset}" if trainer else config.preset
    if under_launcher():
        # Every torchrun worker runs this: the name must not depend on when each one got here.
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        if run_id == "none" or resume:
            raise ValueError("under torchrun, name the run: run.name=NAME (the same on every node)")
        return root / f"{prefix}-{run_id}"
    if resume:
        runs = sorted([*root.glob(f"{prefix}-*"), *_legacy_runs(root, config.preset, trainer)],
                      key=lambda p: p.stat().st_mtime)
        if not runs:
            raise FileNotFoundError(f"--resume: no earlier {prefix} run in {root}; name one with run.name=")
        return runs[-1]
    return root / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def _legacy_runs(root: Path, preset: str, trainer: str | None) -> list[Path]:
    """Runs named ``<preset>-<date>-<time>`` (before names carried the trainer) that this trainer wrote."""
    import json

    if not trainer:
        return []
    found = []
    for path in root.glob(f"{preset}-*"):
        try:
            recorded = json.loads((path / "config.json").read_text()).get("trainer", "grpo")
        except (OSError, ValueError):
            continue
        if recorded == trainer:
            found.append(path)
    return found


def resume_hint(run_dir: Path, tool: str = "accel-grpo") -> str:
    latest = checkpoint.latest_complete(run_dir / "checkpoints")
    if latest is None:
        return "no checkpoint was written yet: start the run again"
    where = "" if run_dir.parent == Path("runs") else f" run.output_dir={run_dir.parent}"
    return (f"latest complete checkpoint {latest}; continue with: {tool} --resume run.name={run_dir.name}"
            f"{where} (the run keeps its recorded config; add only what should change, e.g. train.steps=N)")
