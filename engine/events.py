"""The engine's observer events, in one place: the engine calls these functions, never the hook relay itself.

Each function forwards one event to the plugins that implement it (``on_mode_switch``, ``on_transfer``,
``on_optimizer_step``). Keeping the calls behind this seam lets the hook specification and its cost when nobody
listens change in one module.
"""

from __future__ import annotations

from typing import Any

import accel_backends


def mode_switch(engine: Any, mode: str, entering: bool) -> None:
    """The engine enters or leaves ``train_mode`` / ``eval_mode``."""
    accel_backends.hook().on_mode_switch(engine=engine, mode=mode, entering=entering)


def transfer(engine: Any, what: str, destination: str, num_bytes: int, seconds: float | None = None) -> None:
    """The engine moved ``what`` to ``destination`` (``seconds``: how long the move took, where measured)."""
    accel_backends.hook().on_transfer(engine=engine, what=what, destination=destination, num_bytes=num_bytes)


def optimizer_step(engine: Any, step: int, metrics: dict) -> None:
    """An optimizer step finished or was skipped."""
    accel_backends.hook().on_optimizer_step(engine=engine, step=step, metrics=metrics)
