"""Pickled weights in a model directory the user names (``model.path``, ``teacher.path``, ``reward_model.path``,
``critic.path``): checked in the launching process, before any worker, by a weights-only load.

transformers reads ``pytorch_model*.bin`` with ``torch.load(weights_only=True)``, so a planted pickle does not run
there either; but its refusal would surface in every worker as a many-line traceback. Here it is one line naming the
file. The tensors are memory-mapped, not read: checking a large model costs its pickle, not its weights.
"""

from __future__ import annotations

from pathlib import Path

from .errors import CorruptCheckpoint, UnsafeCheckpoint
from .safe_reader import load_data

PICKLED_WEIGHTS = ("pytorch_model*.bin", "adapter_model.bin")  # what transformers and PEFT load besides safetensors


def pickled_weights_problems(path, key: str | None) -> list[str]:
    """One line per pickled weights file of the local model directory ``path`` that asks to run code (none for a
    hub name or a directory of safetensors), prefixed with ``key`` when given; a damaged file is left to
    transformers to name."""
    directory = Path(str(path))
    if not directory.is_dir():
        return []
    files = sorted({file for pattern in PICKLED_WEIGHTS for file in directory.glob(pattern) if file.is_file()})
    problems = []
    for file in files:
        try:
            load_data(file, mmap=True)
        except UnsafeCheckpoint as exc:
            problems.append(f"{key}: {exc}" if key else str(exc))
        except CorruptCheckpoint:
            continue
    return problems
