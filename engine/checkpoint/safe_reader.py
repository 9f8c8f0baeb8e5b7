"""Reading a checkpoint without unpickling arbitrary objects.

Tensors and small values load with ``weights_only=True``; the checkpoint's ``.metadata`` loads with an unpickler that
knows exactly the names DCP metadata holds (``metadata_unpickler.py``). A metadata file that names anything else is
refused (``UnsafeCheckpoint``: one line, nothing in it run); one that cannot be parsed is damaged
(``CorruptCheckpoint``).
"""

from __future__ import annotations

import io
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
        raise CorruptCheckpoint(f"checkpoint file {file} is damaged: {type(exc).__name__}: {exc}") from exc


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
