"""The end of a training step in the frame's loop (``loop.py``): rank 0's progress bar moves on, a checkpoint is
saved when one is due (then sized and pruned), and when the loop ends the bar and the loggers close and the curves
are drawn."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from .. import checkpoint
from .retention import after_save


def advance(progress, shown: dict) -> None:
    """One step more on the bar (rank 0 with ``run.progress``; else nothing), with ``shown`` beside it."""
    if progress is not None:
        progress.set_postfix(shown)
        progress.update(1)


def save_if_due(engines, run_dir: Path, run, step: int, total: int, *, stopping: bool, rank: int, progress,
                tool: str) -> None:
    """After ``step`` (0-based) of ``total``: a checkpoint every ``run.save_every`` steps, after the last step, and
    when the run is stopping (every rank calls this; rank 0 then keeps ``run.keep_checkpoints``). ``engines``: the
    one engine, or every trained engine by name (one checkpoint of them all, ``checkpoint/engine_set.py``)."""
    every = run.save_every
    if (every and (step + 1) % every == 0) or step + 1 == total or stopping:
        path = run_dir / "checkpoints" / f"step_{step + 1:06d}"
        started = time.perf_counter()
        checkpoint.save_engines(engines if isinstance(engines, dict) else {"policy": engines}, path)
        if rank == 0:
            after_save(path, run.keep_checkpoints, progress, tool=tool, seconds=time.perf_counter() - started)


def finish(progress, loggers, plot: Callable[[], None]) -> None:
    """The loop is over: close the bar and the loggers (rank 0), then draw the curves from ``metrics.jsonl``."""
    if progress is not None:
        progress.close()
    if loggers is not None:
        loggers.close()
        plot()
