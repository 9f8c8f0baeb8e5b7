"""A run's directory: ``<run.output_dir>/<run.name>``, or ``<trainer>-<preset>-<date>-<time>``; ``--resume`` finds
the newest run of the trainer and preset (also one named before names carried the trainer); under torchrun every
node must name it. A directory holds one run: a new run is refused where one already is (``claim``), or with
``run.overwrite=true`` moves it aside, never deleting it. And the line that says how to continue a run."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .. import checkpoint

TRACEBACKS = "tracebacks.txt"  # in the run (or eval) directory: the workers' tracebacks when one failed
ASIDE = ".old-"  # an earlier run moved aside by run.overwrite=true: <name>.old-<date>-<time>


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
        runs = sorted([p for p in [*root.glob(f"{prefix}-*"), *_legacy_runs(root, config.preset, trainer)]
                       if ASIDE not in p.name], key=lambda p: p.stat().st_mtime)
        if not runs:
            raise FileNotFoundError(f"--resume: no earlier {prefix} run in {root}; name one with run.name=")
        return runs[-1]
    return _unused(root / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}")


def _unused(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``... when it is taken (two runs started within the same second)."""
    found, number = path, 1
    while found.exists():
        number += 1
        found = path.with_name(f"{path.name}-{number}")
    return found


def holds_files(directory: Path) -> bool:
    """Whether ``directory`` exists and has anything in it (an empty one holds nothing to lose)."""
    return directory.is_dir() and any(directory.iterdir())


def claim(directory: Path, overwrite: bool, *, move: bool = True) -> str | None:
    """A new run (not ``--resume``) may start in ``directory``: checked before any worker starts, so that an earlier
    run's files are never cut, rewritten or mixed with the new run's. Refused in one line (ValueError) where a run
    already is; with ``overwrite`` that run is renamed to ``<name>.old-<date>-<time>`` (never deleted) and the line
    saying where is returned. ``move``: False on the ranks that only check (rank 0 moves it under torchrun)."""
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"run directory {directory} is a file: choose another run.name or run.output_dir")
    if not holds_files(directory):
        return None
    if not overwrite:
        raise ValueError(f"run directory {directory} already holds a run: continue it with --resume "
                         f"run.name={directory.name}, start a new one under another run.name, or pass "
                         "run.overwrite=true to move the old run aside (it is never deleted)")
    if not move:
        return None
    aside = _unused(directory.with_name(f"{directory.name}{ASIDE}{time.strftime('%Y%m%d-%H%M%S')}"))
    os.rename(directory, aside)
    return f"run.overwrite=true: moved the earlier run {directory} to {aside}"


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


def unwritable(path, exc: OSError, where: str = "run.output_dir") -> str:
    """The one line for a file that cannot be read or written (read-only, full disk, a file in the way)."""
    if path is None:
        return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
    return f"cannot write {exc.filename or path}: {exc.strerror or exc}: choose a writable {where} (or free space)"


def resume_hint(run_dir: Path, tool: str = "accel-grpo") -> str:
    latest = checkpoint.latest_complete(run_dir / "checkpoints")
    if latest is None:
        if holds_files(run_dir):  # its metrics, config.json...: a new start there must say so (claim)
            return (f"no checkpoint was written yet: start the run again with run.overwrite=true (the files in "
                    f"{run_dir} are moved aside) or under another run.name")
        return "no checkpoint was written yet: start the run again"
    where = "" if run_dir.parent == Path("runs") else f" run.output_dir={run_dir.parent}"
    return (f"latest complete checkpoint {latest}; continue with: {tool} --resume run.name={run_dir.name}"
            f"{where} (the run keeps its recorded config; add only what should change, e.g. train.steps=N)")
