"""Save and load the engine's training state with ``torch.distributed.checkpoint`` (sharded, any FSDP version).

A save writes into ``<path>.partial``; every file is flushed to disk (fsync), and only after every rank has
confirmed its part does rank 0 write the metadata file ``engine_meta.json`` (the mark of a complete checkpoint,
with the size of every file) and rename the directory into place. A crash at any point leaves the previous
checkpoint at ``<path>`` intact, and ``latest_complete()`` never picks a ``.partial`` directory. Loading checks
every file against the recorded sizes first, so a truncated file is named instead of failing deep inside torch.

Loading never unpickles arbitrary objects (``safe_reader.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..runtime import on_every_rank
from .errors import CorruptCheckpoint, checkpoint_failure
from .fresh_optimizer import never_stepped, unstep
from .safe_reader import SafeLoadPlanner, SafeReader, load_data, read_metadata_file

FORMAT = "accel-engine-checkpoint/1"
META_FILE = "engine_meta.json"


# -- helpers ------------------------------------------------------------------------------------------------------


def checkpoint_directory(path) -> Path:
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"checkpoint path {path} is a file: pass a directory (it is created if missing)")
    return path


def _all_ranks_ok(engine, ok: bool) -> bool:
    return on_every_rank(ok, engine.backend.metrics_device())


@contextlib.contextmanager
def on_device(engine):
    """Checkpoint I/O runs with parameters and optimizer state on the device; residency is restored after."""
    before = engine.residency()
    engine.to("device")
    try:
        yield
    finally:
        engine.to(before["params"], model=True, optimizer=False)
        engine.to(before["optimizer"], model=False, optimizer=True)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_directory(partial: Path, path: Path) -> None:
    """Put a complete ``partial`` in ``path``'s place: the old one is renamed ``<path>.old`` first and removed last,
    so that a crash between the two renames leaves one of them whole (``resolve`` reads ``.old`` then)."""
    previous = path.with_name(path.name + ".old")
    if path.exists():
        shutil.rmtree(previous, ignore_errors=True)
        path.rename(previous)
    partial.rename(path)
    _sync_directory(path.parent)
    shutil.rmtree(previous, ignore_errors=True)


def _sync_directory(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_extra_state(engine, directory: Path) -> None:
    """Per-rank state DCP does not cover: RNG and the learning-rate schedule (tensors and plain numbers)."""
    extra = {"rng": engine.backend.rng_state(), "scheduler": engine.scheduler.state_dict()}
    buffer = io.BytesIO()
    torch.save(extra, buffer)
    _write_synced(directory / f"extra_rank{engine.rank}.pt", buffer.getvalue())


def _write_meta(engine, directory: Path) -> None:
    """The last file of a save, written once every rank confirmed its files: it makes the checkpoint complete."""
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
    meta = {"format": FORMAT, "step": engine.global_step, "skipped_steps": engine.skipped_steps,
            "world_size": engine.world_size, "fsdp_version": engine.config.fsdp_version,
            "backend": engine.backend.name, "files": files}
    _write_synced(directory / META_FILE, json.dumps(meta, indent=2).encode())
    _sync_directory(directory)


# -- save / load --------------------------------------------------------------------------------------------------


def save(engine, path) -> None:
    path = checkpoint_directory(path)
    if engine.optimizer is None:
        raise ValueError("a frozen engine has no training state to checkpoint: use export_hf() for its weights")
    partial = path.with_name(path.name + ".partial")
    if engine.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    with on_device(engine):
        fresh = never_stepped(engine.optimizer)
        model_state, optim_state = get_state_dict(engine.module, engine.optimizer)
        if fresh:  # the state get_state_dict made took a zero step: a fresh one's, as saved and as kept
            unstep(engine.optimizer.state.values(), optim_state.get("state", {}).values())
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(partial))
    error = None
    try:
        write_extra_state(engine, partial)
    except Exception as exc:  # noqa: BLE001 - every rank must learn about it, or the others wait forever
        error = exc
    if _all_ranks_ok(engine, error is None) and engine.rank == 0:
        try:
            _write_meta(engine, partial)
        except Exception as exc:  # noqa: BLE001
            error = exc
    if not _all_ranks_ok(engine, error is None):
        raise RuntimeError(f"saving checkpoint {path} failed; the previous checkpoint there is untouched "
                           f"({error or 'another rank failed'})") from error
    if engine.rank == 0:
        replace_directory(partial, path)
    dist.barrier()


def resolve(path) -> Path:
    """The checkpoint directory to read: ``path``, or ``<path>.old`` if a save died between its two renames."""
    path = checkpoint_directory(path)
    if (path / META_FILE).exists():
        return path
    previous = path.with_name(path.name + ".old")
    if (previous / META_FILE).exists():
        warnings.warn(f"{path} is missing but {previous} is complete (a save was interrupted): loading that",
                      stacklevel=3)
        return previous
    raise FileNotFoundError(f"no checkpoint at {path} (expected {path / META_FILE})")


def verify_files(path: Path, meta: dict) -> None:
    """Every file the save recorded is there with its size (checkpoints written before sizes were recorded pass)."""
    for name, size in meta.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise CorruptCheckpoint(f"checkpoint file {file} is missing")
        actual = file.stat().st_size
        if actual != size:
            raise CorruptCheckpoint(f"checkpoint file {file} is truncated or damaged: {actual} bytes, the save "
                                    f"wrote {size}")


@dataclasses.dataclass
class Readable:
    """A checkpoint this rank has read all of its own files of (``check_readable``); ``load`` loads it."""

    path: Path
    meta: dict
    extra: dict


def check_readable(engine, path) -> Readable:
    """Everything this rank reads of a checkpoint apart from the collective tensor load: the record, the size of
    every file, DCP's metadata (as data: ``safe_reader.py``) and this rank's extra state. No collective, so that the
    ranks can agree on a checkpoint every one of them can read before any loads it (``run_checkpoints.py``).
    ``CorruptCheckpoint`` for a damaged file, ``UnsafeCheckpoint`` for one that asks to run code."""
    path = resolve(path)
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"checkpoint file {path / META_FILE} is unreadable: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a checkpoint of this engine (format "
                         f"{meta.get('format') if isinstance(meta, dict) else meta!r})")
    verify_files(path, meta)
    read_metadata_file(path / ".metadata")
    extra_file = path / f"extra_rank{engine.rank if meta['world_size'] == engine.world_size else 0}.pt"
    extra = load_data(extra_file)
    if not isinstance(extra, dict) or not {"rng", "scheduler"} <= set(extra):
        raise CorruptCheckpoint(f"checkpoint file {extra_file} is damaged: it lacks the RNG or schedule state")
    return Readable(path, meta, extra)


def load(engine, path, readable: Readable | None = None) -> None:
    """Load the checkpoint ``path`` (already checked by this rank when ``readable`` is given). Every failure of the
    tensor load is a ``CorruptCheckpoint`` naming the checkpoint, torch's ``CheckpointException`` (a
    ``BaseException``) included; an interrupt stays an interrupt."""
    readable = readable or check_readable(engine, path)
    path, meta, extra = readable.path, readable.meta, readable.extra
    with on_device(engine):
        model_state, optim_state = get_state_dict(engine.module, engine.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        try:
            dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner())
        except BaseException as exc:  # noqa: BLE001 - CheckpointException is one; the cause is chained
            if not checkpoint_failure(exc):
                raise
            raise CorruptCheckpoint(f"checkpoint {path} could not be read: {str(exc).strip()[-300:]}") from exc
        set_state_dict(engine.module, engine.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
    engine.scheduler.load_state_dict(extra["scheduler"])
    if meta["world_size"] == engine.world_size:
        engine.backend.set_rng_state(extra["rng"])
    else:
        warnings.warn(f"checkpoint was written by {meta['world_size']} ranks, this job has {engine.world_size}: "
                      "weights and optimizer state are resharded, random-number state is not restored",
                      stacklevel=3)
    engine.global_step, engine.skipped_steps = meta["step"], meta["skipped_steps"]
    engine.zero_grad()
