"""What must end while the process group still exists, and errors whose one line says everything.

An inference engine living in a rank (vLLM colocated) tears its own collectives down when it is shut; left to
the interpreter's exit, that runs after the launcher destroyed the process group and ends a finished run with
``ValueError: Invalid process group specified``. So a part that must close first registers ``at_group_end``; the
launcher runs those callbacks when the rank's function returns or raises, before the group goes.

``OneLineError``: an error raised on purpose with a message that says what went wrong and what to do. The launcher
reports it as that line, without the traceback that an unexpected error gets.
"""

from __future__ import annotations

import sys
from typing import Callable

_CALLBACKS: list[Callable[[], None]] = []


class OneLineError(Exception):
    """Raised with a complete message for the user: reported without a traceback."""


def at_group_end(callback: Callable[[], None]) -> None:
    """Call ``callback`` (once) when this rank's work ends, while its process group still exists."""
    _CALLBACKS.append(callback)


def run_group_end_callbacks() -> None:
    """Run and forget every registered callback, the last registered first. A callback that fails is said in one
    line: it must not hide the run's own outcome."""
    while _CALLBACKS:
        callback = _CALLBACKS.pop()
        try:
            callback()
        except Exception as exc:  # noqa: BLE001 - shutting down: report, never raise
            name = getattr(callback, "__qualname__", repr(callback))
            print(f"note: shutting down ({name}) failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
