"""The engine's observer events, in one place: the engine calls these functions, never the hook relay itself.

Each function forwards one event to the plugins implementing it (specified in ``engine/hookspecs.py``). With no
plugin implementing a hook, an event costs a version comparison and a dictionary lookup: which hooks have
listeners is cached and looked up again only when plugins change (``accel_backends.registry.plugins_version``),
so plugins must come and go through the registry (entry points, ``register_plugin`` / ``unregister_plugin``), not
through the pluggy manager directly.
"""

from __future__ import annotations

from typing import Any

import accel_backends
from accel_backends import registry

from . import hookspecs  # noqa: F401 - adds the engine's hook specifications to the plugin manager

_listeners: dict[str, Any] = {}  # hook name -> its HookCaller, or None when no plugin implements it
_listeners_version: int | None = None


def _caller(name: str):
    """The hook to call, or ``None`` when nobody listens (cached until plugins change)."""
    global _listeners_version
    if _listeners_version != registry.plugins_version():
        relay = accel_backends.hook()  # may build the registry, which changes the version: read it after
        _listeners.clear()
        for hook_name in ("on_mode_switch", "on_transfer", "on_optimizer_step"):
            caller = getattr(relay, hook_name)
            _listeners[hook_name] = caller if caller.get_hookimpls() else None
        _listeners_version = registry.plugins_version()
    return _listeners[name]


def mode_switch(engine: Any, mode: str, entering: bool) -> None:
    """The engine enters or leaves ``train_mode`` / ``eval_mode``."""
    caller = _caller("on_mode_switch")
    if caller is not None:
        caller(engine=engine, mode=mode, entering=entering)


def transfer(engine: Any, what: str, destination: str, num_bytes: int, seconds: float | None = None) -> None:
    """The engine moved ``what`` to ``destination`` (``seconds``: how long the move took, where measured)."""
    caller = _caller("on_transfer")
    if caller is not None:
        caller(engine=engine, what=what, destination=destination, num_bytes=num_bytes, seconds=seconds)


def optimizer_step(engine: Any, step: int, metrics: dict) -> None:
    """An optimizer step finished or was skipped."""
    caller = _caller("on_optimizer_step")
    if caller is not None:
        caller(engine=engine, step=step, metrics=metrics)
