"""The one loader of ``"package.module:attribute"`` names given in a config (reward functions, tools, environments,
rollout engines named by a plugin), so that every such failure reads the same way: which key, the value, what went
wrong, what to do; one line, before any worker starts. The working directory is importable, as under ``python -m``."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Callable


class ObjectLoadError(ValueError):
    """A ``module:attribute`` name that cannot be loaded (one line naming the key, the value and the fix)."""


def working_directory_importable() -> None:
    """A user's ``my_rewards.py`` in the directory the command runs in imports, as under ``python -m`` (console
    scripts do not put that directory on ``sys.path``). Added last: it never shadows an installed module; spawned
    workers start in the same directory and inherit ``sys.path``."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


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
    working_directory_importable()
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
