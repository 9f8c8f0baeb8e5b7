"""What a rank was doing when it failed: ``with phase("backward"): ...`` labels errors raised inside.

The innermost label wins: an error in the backward pass of an update reads "backward", not "update". The launcher
(``engine.launch``) puts the label, the rank and the original error into the one line the user sees.
"""

from __future__ import annotations

import contextlib
import functools

_ATTRIBUTE = "accel_phase"


@contextlib.contextmanager
def phase(name: str):
    try:
        yield
    except BaseException as exc:
        if getattr(exc, _ATTRIBUTE, None) is None:
            try:
                setattr(exc, _ATTRIBUTE, name)
            except AttributeError:  # a few built-in exception types refuse attributes; the label is optional
                pass
        raise


def phase_of(exc: BaseException) -> str | None:
    """The innermost phase ``exc`` passed through, following ``raise ... from`` chains."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        label = getattr(exc, _ATTRIBUTE, None)
        if label is not None:
            return label
        exc = exc.__cause__ or exc.__context__
    return None


def labelled(name: str):
    """Decorator form: errors raised inside the function are labelled ``name``."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with phase(name):
                return fn(*args, **kwargs)

        return wrapper

    return decorate
