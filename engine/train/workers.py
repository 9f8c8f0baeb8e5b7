"""How many worker processes a command starts on this node: ``--nproc N|auto``, else the config's ``nproc``; under
torchrun, the job's ``WORLD_SIZE``."""

from __future__ import annotations

import argparse
import os


def parse_nproc(text: str) -> int | str:
    """``--nproc``'s value: a positive integer, or ``auto`` (one per visible accelerator; 2 on the CPU)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or auto, got {text!r}")
    return value


def world_size(config, nproc_arg: int | str | None = None) -> int:
    from ..runtime import under_launcher

    if under_launcher():
        return int(os.environ["WORLD_SIZE"])
    nproc = nproc_arg if nproc_arg is not None else config.nproc
    if nproc == "auto":
        import accel_backends

        backend = accel_backends.get_backend()
        nproc = 2 if backend.device_type == "cpu" else backend.device_count()
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive integer or 'auto', got {nproc!r}")
    return nproc


def is_rank0() -> bool:
    """Under torchrun every rank runs the CLI; only rank 0 speaks."""
    return os.environ.get("RANK", "0") == "0"
