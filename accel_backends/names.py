"""Helping users who mistype a name: the one "did you mean" check behind every unknown-name error."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, choices: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean PREFIXX?)`` for the closest of ``choices``, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def not_one_of(key: str, value, choices: Iterable[str]) -> str:
    """``KEY must be one of A, B, got 'v' (did you mean KEY=a?)``: the line for a setting outside its choices."""
    choices = list(choices)
    return f"{key} must be one of {', '.join(choices)}, got {value!r}{did_you_mean(str(value), choices, key + '=')}"
