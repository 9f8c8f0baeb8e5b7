"""Trainers by name, collected from every plugin's ``register_recipes`` and ``register_algorithms`` hooks (the
built-ins through the same hooks, ``builtin.py``). A recipe or algorithm registered as ``"module:Attribute"`` is
imported only when it is chosen; an algorithm runs on the one RL recipe (``builtin.RL_RECIPE``) bound to its name."""

from __future__ import annotations

import importlib

import accel_backends
from accel_backends import registry as backend_registry
from accel_backends.names import did_you_mean

from . import builtin, hookspecs  # noqa: F401 - hookspecs adds register_recipes to the plugin manager
from .recipe import Recipe

BUILTIN_PLUGIN = "builtin.recipes"


class RecipeError(ValueError):
    """A trainer that cannot be used: unknown, registered twice, failed to import, or not a Recipe."""


class AlgorithmEntry(str):
    """An RL algorithm's registration (its class, or ``"module:Class"``): the RL recipe bound to it is the trainer."""

    def __new__(cls, target):
        entry = super().__new__(cls, target if isinstance(target, str) else f"{target.__module__}:{target.__name__}")
        entry.target = target
        return entry


def registered() -> tuple[dict[str, tuple[object, str]], list[str]]:
    """``{name: (recipe or "module:Attribute", plugin)}`` and the problems met while collecting them."""
    manager = backend_registry.registry().plugin_manager
    if manager.get_plugin(BUILTIN_PLUGIN) is None:
        accel_backends.register_plugin(builtin, name=BUILTIN_PLUGIN)
    found: dict[str, tuple[object, str]] = {}
    problems = [f"plugin '{f.plugin}' ({f.distribution}) failed to load: {f.error}"
                for f in accel_backends.plugin_failures()]
    for hook, wrap in (("register_recipes", None), ("register_algorithms", AlgorithmEntry)):
        impls = sorted(getattr(accel_backends.hook(), hook).get_hookimpls(),
                       key=lambda impl: impl.plugin_name != BUILTIN_PLUGIN)
        for impl in impls:
            def register(name, target, _plugin=impl.plugin_name, _wrap=wrap):
                if name in found:
                    raise RecipeError(f"trainer name {name!r} is registered twice: by plugin '{found[name][1]}' and "
                                      f"by plugin '{_plugin}'; uninstall one of them")
                found[name] = (_wrap(target) if _wrap else target, _plugin)

            try:
                impl.function(register=register)
            except RecipeError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken plugin is reported; the other trainers still work
                problems.append(f"plugin '{impl.plugin_name}' raised in {hook}: {type(exc).__name__}: {exc}")
    return found, problems


def recipe_names() -> list[str]:
    return sorted(registered()[0])


def get_recipe(name: str) -> Recipe:
    """An instance of the trainer registered as ``name``."""
    found, problems = registered()
    if name not in found:
        failed = f" Plugins that failed: {'; '.join(problems)}." if problems else ""
        raise RecipeError(f"unknown trainer {name!r}{did_you_mean(name, found)}: registered trainers are "
                          f"{', '.join(sorted(found))}.{failed}")
    recipe, plugin = found[name]
    if isinstance(recipe, AlgorithmEntry):
        algorithm = _imported(recipe.target, name, plugin)
        instance = _imported(builtin.RL_RECIPE, name, plugin)(name, algorithm)
    else:
        recipe = _imported(recipe, name, plugin)
        instance = recipe() if isinstance(recipe, type) else recipe
    if not isinstance(instance, Recipe):
        raise RecipeError(f"trainer {name!r} (from plugin '{plugin}') is {type(instance).__name__}, not a Recipe: "
                          "subclass engine.train.Recipe")
    return instance


def _imported(target, name: str, plugin: str):
    """``target`` itself, or the attribute ``"module:Attribute"`` names."""
    if not isinstance(target, str):
        return target
    module_name, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # noqa: BLE001 - reported with the trainer's and the plugin's names
        raise RecipeError(f"trainer {name!r} (from plugin '{plugin}') failed to import {target!r}: "
                          f"{type(exc).__name__}: {exc}") from None
