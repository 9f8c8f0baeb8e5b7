"""What every trainer's validation shares, owned by the frame: which rows ``data.val_fraction`` holds out of
``data.path`` (the same rows for every trainer, RL and supervised alike) and when validation is due (torchtitan's
``Validator.should_validate``: every ``run.val_every`` steps and after the last)."""

from __future__ import annotations

from typing import TypeVar

import torch

Row = TypeVar("Row")


def split_validation(rows: list[Row], fraction: float, seed: int) -> tuple[list[Row], list[Row]]:
    """``(train, validation)``: a seeded random ``fraction`` of ``rows`` held out (at least one), each side in the
    rows' order. The rows depend only on the count, the fraction and the seed (a torch permutation: the rows the
    RL trainers always held out)."""
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    count = max(1, round(len(rows) * fraction))
    if count >= len(rows):
        raise ValueError(f"data.val_fraction={fraction} leaves no training rows out of {len(rows)}")
    held = set(order[:count])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def should_validate(step: int, total_steps: int | None, every: int) -> bool:
    """Whether validation is due after ``step`` (0-based): after the last step, and every ``every`` steps (0: only
    after the last)."""
    done = step + 1
    return done == total_steps or bool(every and done % every == 0)
