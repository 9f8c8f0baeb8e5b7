"""Reading a checkpoint without unpickling arbitrary objects.

Tensors and small values load with ``weights_only=True``; the checkpoint's metadata loads with an unpickler that
accepts only checkpoint-metadata classes (DCP's own, torch sizes and dtypes, plain data).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

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


class SafeReader(dcp.FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        with open(Path(self.path) / ".metadata", "rb") as f:
            metadata = _MetadataUnpickler(f).load()
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
