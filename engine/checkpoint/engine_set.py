"""One checkpoint of every trained engine of a run (a policy and a critic, say), complete only once all of them are.

A recipe with one trained engine keeps the one-engine format (``store.py``: the step directory is that engine's
checkpoint). With several, the step is written into ``<path>.partial``: each engine saves its own checkpoint into a
sub-directory named after it (``policy/``, ``critic/``: each atomic, confirmed by every rank), and only after the
last of them does rank 0 write the step's ``engine_meta.json`` (format ``accel-run-checkpoint/1``, the engines'
names, the policy's first) and rename the directory into place, as a one-engine save does. A run killed between
two engines' saves leaves a ``.partial`` directory that never counts: the previous complete step is the resume
point. Loading reads every engine's part (each checked against its recorded sizes) or fails naming the missing one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch.distributed as dist

from ..runtime import phase
from .errors import CorruptCheckpoint
from .store import (
    META_FILE,
    _sync_directory,
    _write_synced,
    check_readable,
    checkpoint_directory,
    load,
    replace_directory,
)

FORMAT = "accel-run-checkpoint/1"


def save_engines(engines: dict, path) -> None:
    """Save every engine of ``engines`` (name -> FSDPEngine, the policy first) as the one checkpoint ``path``."""
    if len(engines) == 1:
        next(iter(engines.values())).save_checkpoint(path)
        return
    path = checkpoint_directory(path)
    first = next(iter(engines.values()))
    partial = path.with_name(path.name + ".partial")
    if first.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    for name, engine in engines.items():
        engine.save_checkpoint(partial / name)  # complete only once every rank confirmed its part
    if first.rank == 0:
        meta = {"format": FORMAT, "step": first.global_step, "engines": list(engines), "policy": next(iter(engines))}
        _write_synced(partial / META_FILE, json.dumps(meta, indent=2).encode())
        _sync_directory(partial)
        replace_directory(partial, path)
    dist.barrier()


def step_meta(path) -> dict:
    """The step directory's ``engine_meta.json`` (either format)."""
    try:
        return json.loads((Path(path) / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"checkpoint file {Path(path) / META_FILE} is unreadable: {exc}") from exc


def parts_of(path) -> dict[str, Path] | None:
    """A several-engine checkpoint's parts (name -> directory), or None for a one-engine checkpoint."""
    meta = step_meta(path)
    if meta.get("format") != FORMAT:
        return None
    return {name: Path(path) / name for name in meta["engines"]}


def policy_checkpoint(path) -> Path:
    """The policy's checkpoint in a step directory: the step itself (one engine) or its policy's part."""
    meta = step_meta(path)
    return Path(path) / meta["policy"] if meta.get("format") == FORMAT else Path(path)


def check_engines_readable(engines: dict, path) -> dict:
    """Every engine's part of the checkpoint ``path`` checked by this rank (``store.check_readable``: no
    collective), by engine name; a one-engine checkpoint fits a recipe with one engine only."""
    parts = parts_of(path)
    if parts is None:
        if len(engines) != 1:
            raise ValueError(f"{path} holds one engine's checkpoint; this run trains {', '.join(engines)}: resume "
                             "it with the recipe that wrote it")
        name, engine = next(iter(engines.items()))
        return {name: check_readable(engine, path)}
    if list(parts) != list(engines):
        raise ValueError(f"{path} holds the engines {', '.join(parts)}; this run trains {', '.join(engines)}")
    for name in engines:
        if not (parts[name] / META_FILE).is_file():
            raise CorruptCheckpoint(f"checkpoint {path} has no complete {name} part ({parts[name]})")
    return {name: check_readable(engine, parts[name]) for name, engine in engines.items()}


def load_engines(engines: dict, path, checked: dict | None = None) -> None:
    """Load the checkpoint ``path`` into ``engines`` (name -> FSDPEngine), from the parts ``checked`` by
    ``check_engines_readable`` (read again when not given)."""
    checked = checked or check_engines_readable(engines, path)
    with phase("checkpoint load"):
        for name, engine in engines.items():
            load(engine, checked[name].path, checked[name])
