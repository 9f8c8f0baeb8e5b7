"""The hook implementations: with ``ACCEL_TRACE_DIR`` set, every event of every engine goes into its rank's trace.

Without the variable each hook returns at once. The directory is read when a process sees its first event.

The hooks are the engine's (``engine/hookspecs.py``). They are marked ``optionalhook`` instead of importing the
engine here: this module is loaded wherever the plugin registry is built (``accel-backends list`` too), and
pluggy checks them against the engine's specification as soon as ``engine`` is imported.
"""

from __future__ import annotations

import atexit
import os

import accel_backends

from .timeline import Timeline

TRACE_DIR_ENV = "ACCEL_TRACE_DIR"

hookimpl = accel_backends.hookimpl(optionalhook=True)  # the engine specifies these hooks (see above)

_timelines: dict[int, Timeline] = {}  # rank -> its timeline (one per process in practice)


def _timeline(engine) -> Timeline | None:
    directory = os.environ.get(TRACE_DIR_ENV)
    if not directory:
        return None
    rank = int(getattr(engine, "rank", 0))
    timeline = _timelines.get(rank)
    if timeline is None:
        timeline = _timelines[rank] = Timeline(directory, rank)
    return timeline


@hookimpl
def on_mode_switch(engine, mode, entering):
    timeline = _timeline(engine)
    if timeline is not None:
        timeline.mode_switch(engine, mode, entering)


@hookimpl
def on_transfer(engine, what, destination, num_bytes, seconds):
    timeline = _timeline(engine)
    if timeline is not None:
        timeline.transfer(engine, what, destination, num_bytes, seconds)


@hookimpl
def on_optimizer_step(engine, step, metrics):
    timeline = _timeline(engine)
    if timeline is not None:
        timeline.optimizer_step(engine, step, metrics)


@atexit.register
def _write_all() -> None:
    for timeline in _timelines.values():
        timeline.write()
