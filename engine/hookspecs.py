"""The engine's observer events: hooks for profilers, loggers and tests, added to the device plugins' manager.

They are specified here, not in ``accel_backends``, because they are about training: the device layer knows
nothing of engines. Importing ``engine`` (or just this module) adds them to the plugin manager; an observer
plugin imports this module before defining its ``@accel_backends.hookimpl`` functions.

The engine calls them through ``engine/events.py`` only. Their return values are ignored; an exception raised by
an observer propagates into training, so observers must not raise. When no plugin implements a hook, calling it
costs one integer comparison and one dictionary lookup (``events.py`` caches who listens); nothing is built for
the event.
"""

import sys

import accel_backends
from accel_backends import hookspec


@hookspec
def on_mode_switch(engine, mode, entering):
    """The engine enters (``entering=True``) or leaves (``False``) a ``train_mode`` / ``eval_mode`` context.

    ``mode`` is ``"train"`` or ``"eval"``. The enter event fires before anything offloaded is brought back; the
    exit event fires after it went back out. Every enter event is followed by an exit event, also when the body,
    the onload or the offload raises. Nested contexts fire their own pair.
    """


@hookspec
def on_transfer(engine, what, destination, num_bytes, seconds):
    """The engine moved ``what`` (``"params"``, ``"grads"`` or ``"optimizer"``) to ``destination``.

    ``destination`` is ``"device"`` or ``"cpu"``; ``num_bytes`` is the size that crossed between host and device
    (this rank's shards); ``seconds`` is how long the move took, or ``None`` where it was not measured. Fires
    after the move (a mode's auto offload/onload, or ``engine.to()``), only when something moved: never in a mode
    switch with nothing offloaded. An implementation may leave out ``seconds`` from its signature (pluggy passes
    only the arguments it names).
    """


@hookspec
def on_optimizer_step(engine, step, metrics):
    """``optimizer_step()`` finished (or skipped a non-finite step); ``step`` counts attempts from 1.

    ``metrics`` holds at least ``grad_norm``, ``lr`` and ``skipped``; treat it as read-only.
    """


accel_backends.add_hookspecs(sys.modules[__name__])
