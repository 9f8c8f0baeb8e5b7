"""A run's checkpoints: ``step_<N>`` directories, which of them are complete, loading the newest one, and keeping
only the newest few (``prune``)."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

from .engine_set import load_engines
from .store import META_FILE, CorruptCheckpoint

STEP_DIRECTORY = re.compile(r"step_(\d+)(\.old)?")  # a checkpoint of a run; never .partial


def complete_checkpoints(directory) -> list[Path]:
    """The complete checkpoints in ``directory``, newest first (``step_<digits>``; ``.partial`` never counts).

    A ``step_N.old`` counts only when ``step_N`` is missing or incomplete: a save died between its two renames.
    """
    found: dict[int, Path] = {}
    for child in Path(directory).glob("step_*"):
        match = STEP_DIRECTORY.fullmatch(child.name)
        if match is None or not (child / META_FILE).is_file():
            continue
        step = int(match.group(1))
        if step not in found or not match.group(2):  # step_N wins over step_N.old
            found[step] = child
    return [found[step] for step in sorted(found, reverse=True)]


def latest_complete(directory) -> Path | None:
    """The newest complete checkpoint in ``directory`` (e.g. a run's ``checkpoints/``), or None."""
    found = complete_checkpoints(directory)
    return found[0] if found else None


def step_of(path) -> int:
    """The step number in a checkpoint directory's name (``step_000040`` or ``step_000040.old``: 40)."""
    match = STEP_DIRECTORY.fullmatch(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not named step_<digits>")
    return int(match.group(1))


def load_latest(engine, directory, fallback: bool = True) -> Path:
    """Load the newest complete checkpoint in ``directory``; if it is corrupt and ``fallback``, the one before.
    ``engine``: one engine, or every trained engine of the run by name (``engine_set.py``).

    Returns the directory loaded. Every rank sees the same files, so every rank takes the same decision.
    """
    candidates = complete_checkpoints(directory)
    if not candidates:
        raise FileNotFoundError(f"no complete checkpoint in {directory} (a complete one is a step_<digits> "
                                f"directory holding {META_FILE})")
    for index, candidate in enumerate(candidates):
        try:
            if isinstance(engine, dict):
                load_engines(engine, candidate)
            else:
                engine.load_checkpoint(candidate)
            return candidate
        except CorruptCheckpoint as exc:
            older = candidates[index + 1] if index + 1 < len(candidates) else None
            if not fallback or older is None:
                hint = ("; run.resume_fallback=true would load the previous one" if older is not None and not
                        fallback else "")
                raise CorruptCheckpoint(f"{exc}{hint}") from exc
            warnings.warn(f"{exc}; falling back to the previous complete checkpoint {older}", stacklevel=2)
    raise AssertionError("unreachable")


def directory_size(path) -> int:
    """Bytes in the files under ``path`` (what a checkpoint costs on disk)."""
    return sum(file.stat().st_size for file in Path(path).rglob("*") if file.is_file())


def prune(directory, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints in ``directory``; return what was deleted.

    Only complete checkpoints are counted and deleted, so the newest complete one always stays, and a ``.partial``
    directory (a save in progress, or one a crash cut short) is never touched. A ``step_N.old`` counts as step N's
    checkpoint when ``step_N`` is missing (a save died between its two renames); deleting step N deletes both.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a positive integer, got {keep!r}: the newest complete checkpoint is never "
                         "deleted")
    removed = []
    for older in complete_checkpoints(directory)[keep:]:
        name = f"step_{STEP_DIRECTORY.fullmatch(older.name).group(1)}"
        for twin in (older.with_name(name), older.with_name(name + ".old")):
            if twin.is_dir():
                shutil.rmtree(twin)
                removed.append(twin)
    return removed
