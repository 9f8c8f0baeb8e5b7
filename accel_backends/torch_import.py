"""``import torch`` for this package, and what to do when torch's device-backend autoload breaks it.

At the end of ``import torch``, torch runs every ``torch.backends`` entry point (its device-backend autoload). When
one raises (torch_npu installed but its vendor libraries not loaded, or built for another torch), ``import torch``
itself raises, so nothing that imports torch can even say why. This module (standard library only) recognises
that failure. The ``accel-backends`` command then runs itself again with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` and
the failure in ``ACCEL_BACKENDS_TORCH_AUTOLOAD_FAILURE``, so that it can print its diagnosis and each backend's own
lazy import can report the real reason; any other program gets an ``ImportError`` that says the same in one line.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import sys

from .collector import paused_collector

AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"
FAILURE_ENV = "ACCEL_BACKENDS_TORCH_AUTOLOAD_FAILURE"
COMMAND = "accel-backends"
_EXTENSION = re.compile(r"Failed to load the backend extension: ([^\s.]+)")


def autoload_failure(exc: BaseException) -> dict | None:
    """What torch's device-backend autoload failed on, from the error ``import torch`` raised; ``None`` when the
    error is not that. Keys: ``extension`` (the entry point's name), ``entry_point``, ``distribution``, ``error``."""
    match = _EXTENSION.search(str(exc)) if isinstance(exc, RuntimeError) else None
    if match is None:
        return None
    name = match[1]
    cause = exc.__cause__ or exc.__context__
    failure = {"extension": name, "entry_point": None, "distribution": None,
               "error": f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)}
    for entry_point in importlib.metadata.entry_points(group="torch.backends"):
        if entry_point.name == name:
            failure["entry_point"] = entry_point.value
            dist = getattr(entry_point, "dist", None)
            if dist is not None:
                failure["distribution"] = f"{dist.metadata['Name']} {dist.version}"
            break
    return failure


def describe(failure: dict) -> str:
    """One sentence naming the entry point that broke ``import torch`` and what it raised."""
    where = f" ({failure['distribution']})" if failure.get("distribution") else ""
    return (f"import torch fails: torch's device-backend autoload ran the torch.backends entry point "
            f"{failure['extension']!r}{where}, which raised {failure['error']}")


def reported_failure() -> dict | None:
    """The failure handed to this process by a run that re-executed itself, if any."""
    text = os.environ.get(FAILURE_ENV)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _is_diagnostics_command() -> bool:
    """Whether this process is ``accel-backends`` (the console script, or ``python -m accel_backends[.cli]``)."""
    if os.path.basename(sys.argv[0]) == COMMAND:
        return True
    argv = list(getattr(sys, "orig_argv", sys.argv))
    for index, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[index + 1] in ("accel_backends", "accel_backends.cli")
    return False


def import_torch():
    """``import torch``; on a broken device-backend autoload, re-run ``accel-backends`` without it, or raise an
    ``ImportError`` that names the entry point and what to do."""
    try:
        with paused_collector():  # torch's import makes ~150,000 lasting objects (collector.py)
            import torch
    except Exception as exc:
        failure = autoload_failure(exc)
        if failure is None:
            raise
        if _is_diagnostics_command() and os.environ.get(AUTOLOAD_ENV) != "0":
            env = {**os.environ, AUTOLOAD_ENV: "0", FAILURE_ENV: json.dumps(failure)}
            sys.stdout.flush()
            sys.stderr.flush()
            argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
            os.execve(sys.executable, [sys.executable, *argv[1:]], env)
        raise ImportError(f"{describe(failure)}. Run {COMMAND} list for the diagnosis and the fix, or set "
                          f"{AUTOLOAD_ENV}=0 to import torch without it") from exc
    return torch
