"""Stop requests inside a worker: SIGINT and SIGTERM end it at once, or at the training loop's next safe point.

The loop opts in with ``stop_at_safe_point()`` and polls ``stop_requested()`` where stopping loses nothing (after
a step, before its checkpoint); ranks must agree on the answer (a collective) before acting on it. A second
signal does not wait for a safe point.
"""

from __future__ import annotations

import signal

_stop = {"signum": 0, "graceful": False}


def _on_stop_signal(signum, frame) -> None:
    first = not _stop["signum"]
    _stop["signum"] = _stop["signum"] or signum
    if not (_stop["graceful"] and first):
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def install_stop_handlers() -> None:
    """SIGINT and SIGTERM stop this process: at once, or at the next safe point after ``stop_at_safe_point()``."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_stop_signal)


def stop_at_safe_point(enabled: bool = True) -> None:
    """The training loop checks ``stop_requested()`` at safe points; a first signal waits for one, a second does not."""
    _stop["graceful"] = enabled


def stop_requested() -> int:
    """The signal number that asked this process to stop (0: none). Ranks must agree on it before acting."""
    return _stop["signum"]


def state() -> dict:
    """A copy of this process's stop state (the in-process launcher restores it after its run)."""
    return dict(_stop)


def restore(saved: dict) -> None:
    _stop.update(saved)
