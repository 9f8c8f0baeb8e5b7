"""The hooks a plugin can implement.

A plugin is any module or object holding functions marked with ``@accel_backends.hookimpl``. Built-in backends
are plugins too: they use the same ``register_backends`` hook as a third-party distribution.

Only ``register_backends`` is needed to add a device. The ``on_*`` hooks are events for observers (profilers,
loggers, tests): the engine calls them, their return values are ignored, and they must be cheap.
"""

import pluggy

PROJECT_NAME = "accel_backends"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_backends(register):
    """Call ``register(backend)`` once per ``DeviceBackend`` instance this plugin provides.

    ``register(backend, replace=True)`` replaces a built-in backend of the same name; without ``replace`` a name
    clash is an error. Constructing a backend must be cheap and must not import vendor packages.
    """


@hookspec
def on_mode_switch(engine, mode, entering):
    """The engine enters (``entering=True``) or leaves a mode context; ``mode`` is ``"train"`` or ``"eval"``."""


@hookspec
def on_transfer(engine, what, destination, num_bytes):
    """The engine moved ``what`` (``"params"``, ``"grads"`` or ``"optimizer"``) to ``destination``.

    ``destination`` is ``"device"`` or ``"cpu"``; ``num_bytes`` is the size that crossed between host and device.
    """


@hookspec
def on_optimizer_step(engine, step, metrics):
    """An optimizer step finished (or was skipped); ``metrics`` holds grad norm, learning rate, skipped flag."""
