"""The one loader of ``"package.module:attribute"`` names given in a config (reward functions, tools, environments,
rollout engines named by a plugin), so that every such failure reads the same way: which key, the value, what went
wrong, what to do; one line, before any worker starts. A module a config names is importable from the working directory,
as under ``python -m``; nothing else there is."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from typing import Callable


class ObjectLoadError(ValueError):
    """A ``module:attribute`` name that cannot be loaded (one line naming the key, the value and the fix)."""


class _NamedModulesHere(importlib.abc.MetaPathFinder):
    """Finds only the top-level modules a config named (``data.reward=my_rewards:score``) in the directory the
    command ran in, and only after every installed module (last on ``sys.meta_path``). The directory itself is never
    put on ``sys.path``: a file there named like a device vendor's package is never imported in its place."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def find_spec(self, fullname, path=None, target=None):
        directory = self.names.get(fullname)
        if directory is None or path is not None:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [directory])


_HERE = _NamedModulesHere()


def working_directory_importable(module_name: str) -> None:
    """A user's ``my_rewards.py`` (or ``my_pkg/``) in the directory the command runs in imports by the name the
    config gives it, as under ``python -m`` (console scripts do not put that directory on ``sys.path``); nothing else
    there does. Installed modules come first. Spawned workers start in the same directory and load the config's
    names through here again."""
    if _HERE not in sys.meta_path:
        sys.meta_path.append(_HERE)
    _HERE.names.setdefault(module_name.partition(".")[0], os.getcwd())


def load_object(spec: str, *, what: str, key: str, accept: Callable[[object], bool] | None = None,
                error: type[Exception] = ObjectLoadError,
                when_unimportable: str = "is it on PYTHONPATH, and does it import by itself?"):
    """The object ``spec`` (``"package.module:attribute"``) names, checked by ``accept`` when given.

    ``what`` says what the attribute must be ("function", "class"), ``key`` where the name came from
    ("data.reward"); a failure raises ``error`` (a subclass of ``ValueError`` for config checks to collect) with
    the message ``"<key> '<spec>': <what went wrong>; <what to do>"`` (``when_unimportable``: what to do when
    the module fails to import).
    """
    def fail(problem: str, fix: str):
        return error(f"{key} {spec!r}: {problem}; {fix}")

    module_name, _, attribute = str(spec).partition(":")
    if not module_name or not attribute:
        raise fail(f"must look like 'package.module:{what}'", f"name the module, a colon, then the {what}")
    working_directory_importable(module_name)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the user's module may fail in any way
        raise fail(f"cannot import module {module_name!r} ({type(exc).__name__}: {exc})",
                   when_unimportable) from None
    found = getattr(module, attribute, None)
    if found is None:
        raise fail(f"module {module_name!r} has no {what} {attribute!r}", f"check the {what}'s name")
    if accept is not None and not accept(found):
        raise fail(f"{attribute!r} in module {module_name!r} is not a {what}", f"name a {what}")
    return found
