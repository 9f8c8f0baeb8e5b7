"""After each checkpoint save (rank 0): say how large it is, and keep only the newest ``run.keep_checkpoints``."""

from __future__ import annotations

from pathlib import Path

from .. import checkpoint


def human_size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def after_save(path: Path, keep: int | None, progress=None, tool: str = "accel-grpo",
               seconds: float | None = None) -> list[Path]:
    """Print the size of the checkpoint just saved at ``path`` (and the ``seconds`` its save took, when given); with
    ``keep``, delete all but the newest ``keep`` complete checkpoints next to it (never the newest complete one, never
    a ``.partial``, never the one just saved: nothing goes while a checkpoint of a later step is there). Returns what
    went."""
    saved = checkpoint.step_of(path)
    newer = [p.name for p in checkpoint.complete_checkpoints(path.parent) if checkpoint.step_of(p) > saved]
    removed = checkpoint.prune(path.parent, keep) if keep and not newer else []
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    line = f"{tool}: saved {path} ({human_size(checkpoint.directory_size(path))}{took})"
    if removed:
        line += f"; removed {', '.join(p.name for p in removed)} (run.keep_checkpoints={keep})"
    if keep and newer:  # newer than the step just saved: not this run's line of checkpoints; the newest would go
        line += f"; kept every checkpoint (run.keep_checkpoints={keep}): {', '.join(newer)} is newer than this save"
    (progress.write if progress is not None else print)(line)
    return removed
