"""Helping users who mistype a name: the one "did you mean" check behind every unknown-name error."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, choices: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean PREFIXX?)`` for the closest of ``choices``, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""
