"""What a rank was doing: ``with phase("backward"): ...`` labels errors raised inside, and, while a
``phase_timings()`` collector is open, adds the phase's time to it (how ``accel-bench`` times a trainer's parts
without reaching into the trainer).

The innermost label wins: an error in the backward pass of an update reads "backward", not "update". The launcher
(``engine.launch``) puts the label, the rank and the original error into the one line the user sees. Timings are
inclusive: a phase inside another counts in both. With no collector open a phase reads no clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable

_ATTRIBUTE = "accel_phase"
_collectors: list[PhaseTimes] = []


@dataclasses.dataclass(eq=False)  # collectors are told apart by identity: two open at once may hold equal figures
class PhaseTimes:
    """Seconds and calls per phase name, while open; ``synchronize`` (e.g. the backend's) runs before each clock
    read at a phase's end, so that a device's queued work counts in the phase that queued it. ``cpu_seconds``: the
    process's CPU time (every thread's) in each phase, which a loaded machine distorts far less than wall time."""

    synchronize: Callable[[], None] | None = None
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    calls: dict[str, int] = dataclasses.field(default_factory=dict)
    cpu_seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, name: str, seconds: float, cpu_seconds: float = 0.0) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1
        self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + cpu_seconds

    def reset(self) -> None:
        self.seconds, self.calls, self.cpu_seconds = {}, {}, {}


@contextlib.contextmanager
def phase_timings(synchronize: Callable[[], None] | None = None):
    """Collect the time of every phase entered inside, on this process."""
    collector = PhaseTimes(synchronize)
    _collectors.append(collector)
    try:
        yield collector
    finally:
        _collectors.remove(collector)


@contextlib.contextmanager
def phase(name: str):
    started = time.perf_counter() if _collectors else None
    started_cpu = time.process_time() if _collectors else 0.0
    try:
        yield
    except BaseException as exc:
        if getattr(exc, _ATTRIBUTE, None) is None:
            try:
                setattr(exc, _ATTRIBUTE, name)
            except AttributeError:  # a few built-in exception types refuse attributes; the label is optional
                pass
        raise
    finally:
        if started is not None:
            for collector in _collectors:
                if collector.synchronize is not None:
                    collector.synchronize()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - started_cpu
            for collector in _collectors:
                collector.add(name, elapsed, cpu)


def phase_of(exc: BaseException) -> str | None:
    """The innermost phase ``exc`` passed through, following ``raise ... from`` chains."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        label = getattr(exc, _ATTRIBUTE, None)
        if label is not None:
            return label
        exc = exc.__cause__ or exc.__context__
    return None


def labelled(name: str):
    """Decorator form: errors raised inside the function are labelled ``name``."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with phase(name):
                return fn(*args, **kwargs)

        return wrapper

    return decorate
