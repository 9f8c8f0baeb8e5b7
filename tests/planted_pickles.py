"""Planted pickles for the tests of what loads checkpoints and model files: each would create ``marker`` (a shell
command) if anything unpickled it as code; the tests assert the marker never appears."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path


def text(value: str) -> bytes:
    data = value.encode()
    return b"\x8c" + bytes([len(data)]) + data if len(data) < 256 else b"X" + struct.pack("<I", len(data)) + data


def global_of(module: str, name: str) -> bytes:
    return text(module) + text(name) + pickle.STACK_GLOBAL


def call(module: str, name: str, *args: str) -> bytes:
    """A protocol-4 pickle of ``module.name(*args)`` (REDUCE): what a planted ``.metadata`` is."""
    return pickle.PROTO + b"\x04" + global_of(module, name) + pickle.MARK + b"".join(map(text, args)) \
        + pickle.TUPLE + pickle.REDUCE + pickle.STOP


def shell_payload(marker: Path) -> bytes:
    """The issue's planted ``.metadata``: ``os.system`` reached through a module under DCP's package."""
    return call("torch.distributed.checkpoint.filesystem", "os.system", f"touch {marker}")


def plant(file: Path, marker: Path) -> None:
    """Replace ``file`` by the shell payload, padded to its size (the sizes its checkpoint recorded still match:
    whoever plants a file can edit ``engine_meta.json`` as well)."""
    payload = shell_payload(marker)
    size = file.stat().st_size
    assert len(payload) <= size, (file, size)
    file.write_bytes(payload + b"\0" * (size - len(payload)))


class ShellCommand:
    """Pickles as ``os.system(command)``: what a planted ``pytorch_model.bin`` holds beside its tensors."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        import os

        return os.system, (self.command,)


def plant_weights(directory: Path, marker: Path) -> Path:
    """A ``pytorch_model.bin`` in ``directory`` that would create ``marker`` if loaded without ``weights_only``."""
    import torch

    file = directory / "pytorch_model.bin"
    torch.save({"lm_head.weight": torch.zeros(2, 2), "planted": ShellCommand(f"touch {marker}")}, file)
    return file
