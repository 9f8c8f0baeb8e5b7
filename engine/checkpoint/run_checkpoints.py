"""A run's checkpoints: ``step_<N>`` directories, which of them are complete, loading the newest one, and keeping
only the newest few (``prune``)."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import torch.distributed as dist

from ..runtime import labelled, max_over_ranks
from .engine_set import check_engines_readable, load_engines, parts_of
from .errors import CorruptCheckpoint, UnsafeCheckpoint, checkpoint_failure
from .safe_reader import load_data, read_metadata_file
from .store import META_FILE

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


@labelled("checkpoint load")
def load_latest(engine, directory, fallback: bool = True) -> Path:
    """Load the newest complete checkpoint in ``directory`` that every rank can read; with ``fallback`` an older one
    when the newest cannot be. ``engine``: one engine, or every trained engine of the run by name (``engine_set.py``).

    Returns the directory loaded. Each rank reads its own files of every candidate first (a damaged
    ``extra_rank1.pt`` fails rank 1 only), then one exact int all-reduce (``max_over_ranks``) tells every rank which
    candidates failed anywhere, so all ranks load the same one, or all stop with the same error. A file that asks
    to run code (``UnsafeCheckpoint``) stops the resume on every rank: no fallback hides it.
    """
    engines = engine if isinstance(engine, dict) else {"policy": engine}
    first = next(iter(engines.values()))
    candidates = complete_checkpoints(directory)
    if not candidates:
        raise FileNotFoundError(f"no complete checkpoint in {directory} (a complete one is a step_<digits> "
                                f"directory holding {META_FILE})")
    considered = candidates if fallback else candidates[:1]
    checked, problems = {}, {}
    for candidate in considered:
        try:
            checked[candidate] = check_engines_readable(engines, candidate)
        except BaseException as exc:  # noqa: BLE001 - every rank must learn of it before any rank loads
            if not checkpoint_failure(exc):
                raise
            problems[candidate] = exc
    verdict = _agree(first, {c: _verdict(problems.get(c)) for c in considered})
    for index, candidate in enumerate(considered):
        if verdict[candidate] == _LOADABLE:
            try:
                load_engines(engines, candidate, checked[candidate])
            except BaseException as exc:  # noqa: BLE001 - CheckpointException included; the ranks agree below
                if not checkpoint_failure(exc):
                    raise
                problems[candidate] = exc
            verdict[candidate] = _agree(first, {candidate: _verdict(problems.get(candidate))})[candidate]
            if verdict[candidate] == _LOADABLE:
                return candidate
        reason = problems.get(candidate)
        if verdict[candidate] == _STOP:
            if reason is not None and _verdict(reason) == _STOP:
                raise reason
            raise UnsafeCheckpoint(f"checkpoint {candidate} was refused on another rank (see its error); nothing "
                                   "in it was run on this one")
        said = str(reason) if reason is not None else f"checkpoint {candidate} could not be read on another rank"
        older = candidates[index + 1] if index + 1 < len(candidates) else None
        if not fallback or older is None:
            hint = "; run.resume_fallback=true would load the previous one" if older is not None else ""
            raise CorruptCheckpoint(f"{said}{hint}") from reason
        warnings.warn(f"{said}; falling back to the previous complete checkpoint {older} (on every rank)",
                      stacklevel=2)
    raise AssertionError("unreachable")


# A candidate's verdict on one rank; the ranks take the worst (largest).
_LOADABLE, _DAMAGED, _STOP = 0, 1, 2


def _verdict(problem: BaseException | None) -> int:
    """Loadable; damaged (a fallback may skip it); or stop: a file that asks to run code (``UnsafeCheckpoint``) or
    a checkpoint of something else (another recipe's engines): no fallback hides those."""
    if problem is None:
        return _LOADABLE
    if isinstance(problem, UnsafeCheckpoint):
        return _STOP
    damaged = isinstance(problem, CorruptCheckpoint) or not isinstance(problem, (ValueError, FileNotFoundError))
    return _DAMAGED if damaged else _STOP


def _agree(engine, verdicts: dict[Path, int]) -> dict[Path, int]:
    """The worst verdict over ranks for each checkpoint: one exact int64 all-reduce (``max_over_ranks``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return verdicts
    worst = max_over_ranks({path.name: verdict for path, verdict in verdicts.items()},
                           engine.backend.metrics_device())
    return {path: int(worst[path.name]) for path in verdicts}


def refuse_unsafe(path) -> None:
    """``UnsafeCheckpoint`` if a file of the checkpoint ``path`` (any engine's part) asks to run code: its DCP
    metadata and every rank's extra state, read as data. Damage is left to the load (and its fallback). Run in the
    launching process before any worker starts, so that the refusal is one line and nothing was started."""
    parts = parts_of(path) or {"": Path(path)}
    for part in parts.values():
        files = [part / ".metadata", *sorted(part.glob("extra_rank*.pt"))]
        for file in files:
            try:
                read_metadata_file(file) if file.name == ".metadata" else load_data(file)
            except CorruptCheckpoint:
                continue


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
