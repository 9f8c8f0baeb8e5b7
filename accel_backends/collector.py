"""Python's cyclic garbage collector, kept off the objects a process's imports made.

Importing torch, FSDP, DCP and transformers creates about 350,000 objects that live as long as the process. The
collector runs every 700 new objects and walks the older ones again and again while they are made: about 900
collections, 0.4 s of CPU in every process that starts a rank, a command or a test worker (15% of its start;
measured with ``gc.callbacks`` on the CPU CI machine). None of those objects is garbage, so the walks find almost
nothing. Two measures:

- ``paused_collector``: no collection while the heavy imports run (``import_torch``, ``engine``'s own imports). The
  collector is as it was afterwards; whatever cycles the imports left are collected at its next run.
- ``freeze_startup``: in a process this project started (a rank), once its imports are done, every object alive
  is moved to the collector's permanent generation (``gc.freeze``) and never walked again. Without it each object
  made during the pause is still walked on its way to the oldest generation, and every full collection of the run
  walks them all. It is never called in a user's own process: importing a library must not change what its
  collector keeps.

A rank's imports happen before its own code runs (the spawn start-up unpickles its function). So while
``spawn.LocalJob`` starts ranks (``starting_children``) it sets ``ACCEL_BACKENDS_STARTING``: in a process
multiprocessing spawned with it, the pause does not end with its block but lasts until ``freeze_startup``, which
also removes the variable, so that nothing the rank starts inherits it.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os

STARTING_ENV = "ACCEL_BACKENDS_STARTING"  # set while a LocalJob's ranks start (see above)


@contextlib.contextmanager
def starting_children():
    """The processes multiprocessing spawns inside the block keep their collector paused until ``freeze_startup``;
    this process's environment is as it was afterwards."""
    before = os.environ.get(STARTING_ENV)
    os.environ[STARTING_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[STARTING_ENV]
        else:
            os.environ[STARTING_ENV] = before


@contextlib.contextmanager
def paused_collector():
    """No automatic collection inside the block; afterwards the collector is as it was (a pause inside a pause, or
    a collector the caller disabled, stays off until its owner turns it on)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled and not _starting_rank():
            gc.enable()


def _starting_rank() -> bool:
    """A rank still starting: a process multiprocessing spawned while ``STARTING_ENV`` was set (any other process
    that inherited the variable, started by another thread meanwhile, collects as usual)."""
    return bool(os.environ.get(STARTING_ENV)) and multiprocessing.parent_process() is not None


def freeze_startup() -> None:
    """Freeze every object alive now (``gc.freeze``) and turn the collector back on: for a process this project
    started, after its imports and before its work. Cycles among the frozen objects are never collected; objects
    made later are collected as always. The start is over: ``STARTING_ENV`` goes."""
    os.environ.pop(STARTING_ENV, None)
    gc.freeze()
    gc.enable()
