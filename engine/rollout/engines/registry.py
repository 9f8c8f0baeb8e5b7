"""Rollout engines by name, collected from every plugin's ``register_rollout_engines`` hook.

The built-in engines come through the same hook (``builtin.py``, registered here on first use), so the plugin
path is the one every run takes. ``rollout.engine`` is resolved, and a lazily named engine imported, by
``check_engine`` in the launching process: an unknown name, a plugin that failed to load or an engine that fails
to import stops the run there, before any worker starts, with the reason.
"""

from __future__ import annotations

import dataclasses

import accel_backends
from accel_backends import registry as backend_registry
from accel_backends.names import did_you_mean
from engine.runtime import OneLineError, at_group_end

from ...object_loader import load_object
from . import builtin, hookspecs  # noqa: F401 - hookspecs adds register_rollout_engines to the plugin manager
from .base import RolloutContext, RolloutEngine

BUILTIN_PLUGIN = "builtin.rollout_engines"


class RolloutEngineError(OneLineError, ValueError):
    """A rollout engine that cannot be used: unknown, failed to load, failed inside, or broke the interface's
    contract. Its message is complete: a run that ends on it reports that one line, without a traceback."""


@dataclasses.dataclass(frozen=True)
class Registration:
    name: str
    engine: object  # a RolloutEngine subclass, a callable taking a RolloutContext, or "module:Attribute"
    plugin: str  # the plugin that registered it


def registrations() -> tuple[dict[str, Registration], list[str]]:
    """Every registered engine by name, and what went wrong while collecting them (one sentence each)."""
    manager = backend_registry.registry().plugin_manager
    if manager.get_plugin(BUILTIN_PLUGIN) is None:
        accel_backends.register_plugin(builtin, name=BUILTIN_PLUGIN)
    found: dict[str, Registration] = {}
    problems = [f"plugin '{f.plugin}' ({f.distribution}) failed to load: {f.error}"
                for f in accel_backends.plugin_failures()]
    impls = accel_backends.hook().register_rollout_engines.get_hookimpls()
    for impl in sorted(impls, key=lambda impl: impl.plugin_name != BUILTIN_PLUGIN):  # the built-ins first
        def register(name, engine, _plugin=impl.plugin_name):
            if name in found:
                raise RolloutEngineError(f"rollout engine name {name!r} is registered twice: by plugin "
                                         f"'{found[name].plugin}' and by plugin '{_plugin}'; uninstall one of them")
            found[name] = Registration(name, engine, _plugin)

        try:
            impl.function(register=register)
        except RolloutEngineError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, the others still work
            problems.append(f"plugin '{impl.plugin_name}' raised in register_rollout_engines: "
                            f"{type(exc).__name__}: {exc}")
    return found, problems


def engine_names() -> list[str]:
    return sorted(registrations()[0])


def resolve(name: str):
    """The factory registered as ``name`` (imported now if it was registered as ``"module:Attribute"``)."""
    found, problems = registrations()
    if name not in found:
        failed = f" Plugins that failed: {'; '.join(problems)}." if problems else ""
        raise RolloutEngineError(f"unknown rollout.engine {name!r}{did_you_mean(name, found)}: registered engines "
                                 f"are {', '.join(sorted(found))}.{failed} Choose one of those, or install the "
                                 f"plugin that provides {name!r}")
    registration = found[name]
    if not isinstance(registration.engine, str):
        return registration.engine
    others = ", ".join(sorted(n for n in found if n != name))
    return load_object(registration.engine, what="rollout engine", error=RolloutEngineError,
                       key=f"rollout.engine {name!r} (from plugin '{registration.plugin}')",
                       when_unimportable=f"install what it needs, or choose another engine ({others})")


def check_engine(name: str) -> list[str]:
    """Problems with ``rollout.engine`` found without building it (for the config check)."""
    try:
        resolve(name)
    except RolloutEngineError as exc:
        return [str(exc)]
    return []


def create_rollout_engine(name: str, context: RolloutContext) -> RolloutEngine:
    """Build the engine registered as ``name`` for this rank."""
    engine = resolve(name)(context)
    if not isinstance(engine, RolloutEngine):
        raise RolloutEngineError(f"rollout engine {name!r} built {type(engine).__name__}, not a RolloutEngine: "
                                 "subclass engine.rollout.engines.RolloutEngine")
    engine.name = name
    at_group_end(engine.close)  # an engine with collectives of its own closes before the process group goes
    return engine
