"""What can go wrong reading a checkpoint: a damaged file (a resume may fall back to an older checkpoint) and a file
that asks to run code (refused: nothing in it runs, and no fallback hides it)."""

from __future__ import annotations

from ..runtime import OneLineError


class CorruptCheckpoint(RuntimeError):
    """A checkpoint file is missing, truncated or unreadable; the message names it."""


class UnsafeCheckpoint(OneLineError, ValueError):
    """A checkpoint or weights file holds pickled objects a checkpoint never holds (a callable, a module's attribute):
    loading it could run code, so it is refused. Not a ``CorruptCheckpoint``: a resume does not fall back past it
    silently, the user decides what to trust."""


def unsafe_file_line(file, what: str) -> str:
    """The one line that refuses ``file``: what it asked for, that nothing ran, what to do."""
    return (f"{file} was refused: it asks to load {what}, which a checkpoint never holds (loading it could run "
            "code); nothing in it was run: delete it, or use a checkpoint or model you wrote yourself or trust "
            "(Hugging Face weights: safetensors)")


def checkpoint_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure to read a checkpoint, which a fallback may handle: anything but an interrupt or
    an exit. torch's ``CheckpointException`` derives from ``BaseException``, so ``except Exception`` misses it."""
    return not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit))
