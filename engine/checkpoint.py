"""Checkpoints with ``torch.distributed.checkpoint`` (sharded, any FSDP version) and Hugging Face export.

A save writes into ``<path>.partial``; every file is flushed to disk (fsync), and only after every rank has
confirmed its part does rank 0 write the metadata file ``engine_meta.json`` (the mark of a complete checkpoint,
with the size of every file) and rename the directory into place. A crash at any point leaves the previous
checkpoint at ``<path>`` intact, and ``latest_complete()`` never picks a ``.partial`` directory. Loading checks
every file against the recorded sizes first, so a truncated file is named instead of failing deep inside torch.

Loading never unpickles arbitrary objects: tensors and small values load with ``weights_only=True`` and the
checkpoint's metadata with an unpickler that accepts only checkpoint-metadata classes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

FORMAT = "accel-engine-checkpoint/1"
META_FILE = "engine_meta.json"
STEP_DIRECTORY = re.compile(r"step_(\d+)(\.old)?")  # a checkpoint of a run; never .partial


class CorruptCheckpoint(RuntimeError):
    """A checkpoint file is missing, truncated or unreadable; the message names it."""


# -- safe loading -------------------------------------------------------------------------------------------------

_SAFE_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes", "bool", "slice",
                  "getattr"}


class _MetadataUnpickler(pickle.Unpickler):
    """Accepts only what checkpoint metadata is made of: DCP's own classes, torch sizes and dtypes, plain data."""

    def find_class(self, module: str, name: str):
        allowed = (
            module.startswith("torch.distributed.checkpoint.")
            or (module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)))
            or (module == "torch.serialization" and name == "_get_layout")
            or (module == "builtins" and name in _SAFE_BUILTINS)
            or (module == "collections" and name == "OrderedDict")
            or (module == "pathlib" and name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which is not allowed")
        return super().find_class(module, name)

    def persistent_load(self, pid):  # metadata holds no tensor storages
        raise pickle.UnpicklingError("checkpoint metadata must not contain tensor storages")


class _SafeReader(dcp.FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        with open(Path(self.path) / ".metadata", "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (learning rates, betas, FQNs) load with ``weights_only=True``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        # Check with the safe loader, then hand the parent bytes it re-reads: only checked values get through.
        loaded = torch.load(value, weights_only=True)
        patched = io.BytesIO()
        torch.save(loaded, patched)
        patched.seek(0)
        super().load_bytes(read_item, patched)


# -- helpers ------------------------------------------------------------------------------------------------------


def _directory(path) -> Path:
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"checkpoint path {path} is a file: pass a directory (it is created if missing)")
    return path


def _all_ranks_ok(engine, ok: bool) -> bool:
    flag = torch.tensor([1.0 if ok else 0.0], device=engine.backend.metrics_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return flag.item() == 1.0


@contextlib.contextmanager
def _on_device(engine):
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
    path = _directory(path)
    if engine.optimizer is None:
        raise ValueError("a frozen engine has no training state to checkpoint: use export_hf() for its weights")
    partial = path.with_name(path.name + ".partial")
    previous = path.with_name(path.name + ".old")
    if engine.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    dist.barrier()
    with _on_device(engine):
        model_state, optim_state = get_state_dict(engine.module, engine.optimizer)
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
        if path.exists():
            shutil.rmtree(previous, ignore_errors=True)
            path.rename(previous)
        partial.rename(path)
        _sync_directory(path.parent)
        shutil.rmtree(previous, ignore_errors=True)
    dist.barrier()


def resolve(path) -> Path:
    """The checkpoint directory to read: ``path``, or ``<path>.old`` if a save died between its two renames."""
    path = _directory(path)
    if (path / META_FILE).exists():
        return path
    previous = path.with_name(path.name + ".old")
    if (previous / META_FILE).exists():
        warnings.warn(f"{path} is missing but {previous} is complete (a save was interrupted): loading that",
                      stacklevel=3)
        return previous
    raise FileNotFoundError(f"no checkpoint at {path} (expected {path / META_FILE})")


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

    Returns the directory loaded. Every rank sees the same files, so every rank takes the same decision.
    """
    candidates = complete_checkpoints(directory)
    if not candidates:
        raise FileNotFoundError(f"no complete checkpoint in {directory} (a complete one is a step_<digits> "
                                f"directory holding {META_FILE})")
    for index, candidate in enumerate(candidates):
        try:
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


def _verify_files(path: Path, meta: dict) -> None:
    """Every file the save recorded is there with its size (checkpoints written before sizes were recorded pass)."""
    for name, size in meta.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise CorruptCheckpoint(f"checkpoint file {file} is missing")
        actual = file.stat().st_size
        if actual != size:
            raise CorruptCheckpoint(f"checkpoint file {file} is truncated or damaged: {actual} bytes, the save "
                                    f"wrote {size}")


def load(engine, path) -> None:
    path = resolve(path)
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"checkpoint file {path / META_FILE} is unreadable: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a checkpoint of this engine (format {meta.get('format')!r})")
    _verify_files(path, meta)
    with _on_device(engine):
        model_state, optim_state = get_state_dict(engine.module, engine.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        try:
            dcp.load(state, storage_reader=_SafeReader(path), planner=_SafeLoadPlanner())
        except Exception as exc:  # noqa: BLE001 - name the checkpoint; the cause is chained
            raise CorruptCheckpoint(f"checkpoint {path} could not be read: {str(exc).strip()[-300:]}") from exc
        set_state_dict(engine.module, engine.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
    same_layout = meta["world_size"] == engine.world_size
    extra_file = path / f"extra_rank{engine.rank if same_layout else 0}.pt"
    try:
        extra = torch.load(extra_file, weights_only=True)
    except Exception as exc:  # noqa: BLE001
        raise CorruptCheckpoint(f"checkpoint file {extra_file} could not be read: {exc}") from exc
    engine.scheduler.load_state_dict(extra["scheduler"])
    if same_layout:
        engine.backend.set_rng_state(extra["rng"])
    else:
        warnings.warn(f"checkpoint was written by {meta['world_size']} ranks, this job has {engine.world_size}: "
                      "weights and optimizer state are resharded, random-number state is not restored",
                      stacklevel=3)
    engine.global_step, engine.skipped_steps = meta["step"], meta["skipped_steps"]
    engine.zero_grad()


# -- Hugging Face export ------------------------------------------------------------------------------------------


def _peft_config(engine):
    for module in engine.module.modules():
        configs = getattr(module, "peft_config", None)
        if isinstance(configs, dict) and configs:
            return next(iter(configs.items()))
    return None


def merge_lora_weights(state: dict[str, torch.Tensor], adapter: str, scaling: float) -> dict[str, torch.Tensor]:
    """Fold ``W + scaling * B @ A`` into each base weight and return plain model names."""
    merged = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        name = key.removeprefix("base_model.model.")
        if ".base_layer." in key:
            prefix, _, leaf = key.rpartition(".base_layer.")
            name = name.replace(".base_layer.", ".")
            if leaf == "weight":
                a = state[f"{prefix}.lora_A.{adapter}.weight"].float()
                b = state[f"{prefix}.lora_B.{adapter}.weight"].float()
                value = (value.float() + scaling * (b @ a)).to(value.dtype)
        merged[name] = value
    return merged


def export_hf(engine, path, merge_lora: bool = True) -> None:
    """Gather full weights to rank 0 and write them as safetensors with the model's config."""
    path = _directory(path)
    with _on_device(engine):
        # FSDP1 crashes offloading a full state dict "to the CPU" when it already is there: only offload from a device.
        on_host = engine.backend.device().type == "cpu"
        options = StateDictOptions(full_state_dict=True, cpu_offload=not on_host)
        full = get_model_state_dict(engine.module, options=options)
    if engine.rank == 0:
        from safetensors.torch import save_file

        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        peft = _peft_config(engine)
        if peft is None:
            tensors, filename = full, "model.safetensors"
        else:
            adapter, config = peft
            scaling = config.lora_alpha / (config.r ** 0.5 if config.use_rslora else config.r)
            if merge_lora:
                tensors, filename = merge_lora_weights(full, adapter, scaling), "model.safetensors"
            else:
                tensors = {k.replace(f".{adapter}.", "."): v for k, v in full.items() if ".lora_" in k}
                filename = "adapter_model.safetensors"
                config.save_pretrained(str(partial))
        seen, unique = set(), {}
        for name, tensor in tensors.items():  # tied weights appear twice; keep the first
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                unique[name] = tensor.contiguous()
        save_file(unique, str(partial / filename), metadata={"format": "pt"})
        if engine.model_config is not None and (peft is None or merge_lora):
            engine.model_config.save_pretrained(str(partial))
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)
    dist.barrier()
