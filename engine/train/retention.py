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


def after_save(path: Path, keep: int | None, progress=None, tool: str = "accel-grpo") -> list[Path]:
    """Print the size of the checkpoint just saved at ``path``; with ``keep``, delete all but the newest ``keep``
    complete checkpoints next to it (never the newest complete one, never a ``.partial``). Returns what went."""
    removed = checkpoint.prune(path.parent, keep) if keep else []
    line = f"{tool}: saved {path} ({human_size(checkpoint.directory_size(path))})"
    if removed:
        line += f"; removed {', '.join(p.name for p in removed)} (run.keep_checkpoints={keep})"
    (progress.write if progress is not None else print)(line)
    return removed
