"""The model weights of a sharded checkpoint as full tensors, read by one process without a process group.

A checkpoint written by any number of ranks (FSDP1 or FSDP2) holds each weight in pieces; DCP's metadata says
where each piece lies, so one process can assemble every weight without knowing the world size that wrote it.
Only the ``model`` part is read (not the optimizer state), and nothing is unpickled beyond checkpoint metadata.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from .safe_reader import SafeLoadPlanner, SafeReader, read_metadata_file
from .store import FORMAT, META_FILE, CorruptCheckpoint, verify_files


def checkpoint_meta(path) -> dict:
    """``engine_meta.json`` of a complete checkpoint (format checked, every file present with its recorded size)."""
    path = Path(path)
    meta_file = path / META_FILE
    if not meta_file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {META_FILE}: a save that did not finish, "
                                "or not a checkpoint directory)")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"checkpoint file {meta_file} is unreadable: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise CorruptCheckpoint(f"{path} is not a checkpoint of this engine (format {meta.get('format')!r})")
    verify_files(path, meta)
    read_metadata_file(path / ".metadata")  # refused here, before any work, if it asks to run code
    return meta


def read_model_state(path) -> dict[str, torch.Tensor]:
    """Every model weight of the checkpoint at ``path``, full size, on the host, by its module name.

    The names are those of the model the engine wrapped (a PEFT model's keep their ``base_model.model.`` prefix
    and ``lora_A.<adapter>`` parts); dtypes are those saved (the fp32 master weights under mixed precision).
    """
    path = Path(path)
    checkpoint_meta(path)
    try:
        metadata = SafeReader(path).read_metadata()
        state = {key.removeprefix("model."): torch.empty(item.size, dtype=item.properties.dtype)
                 for key, item in metadata.state_dict_metadata.items()
                 if key.startswith("model.") and isinstance(item, TensorStorageMetadata)}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load({"model": state}, storage_reader=SafeReader(path), planner=SafeLoadPlanner(), no_dist=True)
    except Exception as exc:  # noqa: BLE001 - name the checkpoint; the cause is chained
        raise CorruptCheckpoint(f"checkpoint {path} could not be read: {str(exc).strip()[-300:]}") from exc
    if not state:
        raise CorruptCheckpoint(f"checkpoint {path} holds no model weights")
    return state
