"""Reading a checkpoint without unpickling arbitrary objects.

Tensors and small values load with ``weights_only=True``; the checkpoint's ``.metadata`` loads with an unpickler that
knows exactly the names DCP metadata holds (``metadata_unpickler.py``). A metadata file that names anything else is
refused (``UnsafeCheckpoint``: one line, nothing in it run); one that cannot be parsed is damaged
(``CorruptCheckpoint``).
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from .errors import CorruptCheckpoint, UnsafeCheckpoint, unsafe_file_line
from .metadata_unpickler import Refused, load_metadata


def read_metadata_file(file: Path):
    """The DCP metadata in ``file``: ``UnsafeCheckpoint`` if it names what metadata never holds, ``CorruptCheckpoint``
    if it is not a readable pickle."""
    try:
        with open(file, "rb") as f:
            return load_metadata(f)
    except Refused as exc:
        raise UnsafeCheckpoint(unsafe_file_line(file, exc.what)) from None
    except Exception as exc:  # noqa: BLE001 - a damaged pickle fails in many ways; the file is named
        raise CorruptCheckpoint(f"checkpoint file {file} is damaged: {type(exc).__name__}: {_first_line(exc)}") from exc


def load_data(file: Path, mmap: bool = False):
    """``torch.load(file, weights_only=True)`` (tensors and plain values), with its refusal said as
    ``UnsafeCheckpoint`` and any other failure as ``CorruptCheckpoint``, each naming the file. ``mmap``: tensors
    mapped from the file, not read (a file in torch's zip format; an older one is read whole)."""
    try:
        try:
            return torch.load(file, weights_only=True, mmap=mmap)
        except RuntimeError as exc:
            if not mmap or "mmap" not in str(exc):
                raise
            return torch.load(file, weights_only=True)
    except pickle.UnpicklingError as exc:
        refused = _refused_global(str(exc))
        if refused is not None:
            raise UnsafeCheckpoint(unsafe_file_line(file, refused)) from None
        raise CorruptCheckpoint(f"checkpoint file {file} is damaged: {_first_line(exc)}") from exc
    except Exception as exc:  # noqa: BLE001 - a damaged zip or pickle fails in many ways; the file is named
        raise CorruptCheckpoint(f"checkpoint file {file} could not be read: {_first_line(exc)}") from exc


def _refused_global(message: str) -> str | None:
    """The global torch's weights-only unpickler refused (``Unsupported global: GLOBAL os.system``...), or None when
    the message names none (a damaged file fails with an unknown opcode, say)."""
    found = re.search(r"[Uu]nsupported (?:global: )?GLOBAL ([\w.]+)", message)
    return found.group(1) if found and "Weights only load failed" in message else None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


class SafeReader(dcp.FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        metadata = read_metadata_file(Path(self.path) / ".metadata")
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (learning rates, betas, FQNs) load with ``weights_only=True``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        # Check with the safe loader, then hand the parent bytes it re-reads: only checked values get through.
        loaded = torch.load(value, weights_only=True)
        patched = io.BytesIO()
        torch.save(loaded, patched)
        patched.seek(0)
        super().load_bytes(read_item, patched)
