"""Which rows of ``data.path`` a supervised run holds out for validation: ``data.val_fraction`` of them, picked by the
frame's split (``engine.train.validation.split_validation``: the same rows as every other trainer). The built-in demo
tasks hold out their own fixed rows (their share, or ``data.val_fraction``), as they always have, so that a demo's
figures stay those it has always printed."""

from __future__ import annotations

import random
from typing import TypeVar

from ..train.validation import split_validation

Row = TypeVar("Row")


def held_out(rows: list[Row], val_fraction: float, seed: int, demo_fraction: float | None = None
             ) -> tuple[list[Row], list[Row]]:
    """``(train, validation)`` of ``rows``; ``demo_fraction``: the demo task's share (the rows are the demo's)."""
    if demo_fraction is not None:
        return _demo_rows(rows, val_fraction or demo_fraction, seed)
    if val_fraction:
        return split_validation(rows, val_fraction, seed)
    return rows, []


def _demo_rows(rows: list[Row], fraction: float, seed: int) -> tuple[list[Row], list[Row]]:
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:max(1, int(len(rows) * fraction))])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]
