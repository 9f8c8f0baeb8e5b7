"""Examples as the offline trainers read them, checked before any worker starts: ``text``, a conversation
(``messages``: a list of ``{"role", "content"}`` messages, an assistant message possibly carrying ``tool_calls``,
with the row's ``tools`` schemas), or a prompt and its completion (both text or both message lists). A bad row
fails with ``file:row`` and what to do."""

from __future__ import annotations

import dataclasses
from typing import Any

ROLES = ("system", "user", "assistant", "tool", "developer")


class DataError(ValueError):
    """A row that cannot become an example; the message names the file, the row and what to do."""


@dataclasses.dataclass
class Example:
    """One row, checked: ``text``, or ``messages``, or ``prompt`` + ``completion`` (text or messages)."""

    where: str  # file:row
    text: str | None = None
    messages: list[dict] | None = None
    prompt: Any = None
    completion: Any = None
    tools: list | None = None


@dataclasses.dataclass
class Columns:
    """The columns rows are read from, each named by the ``data.<name>_key`` option of its name; a trainer's data
    adds its own (SFT's text, messages and completion; a pair's chosen and rejected)."""

    prompt: str = "prompt"
    tools: str = "tools"  # a row's tool schemas, passed to the chat template when present

    @classmethod
    def of(cls, data_config, **given):
        """The columns ``data_config`` names; ``given``: those that no ``data`` option names."""
        named = {field.name: getattr(data_config, f"{field.name}_key") for field in dataclasses.fields(cls)
                 if hasattr(data_config, f"{field.name}_key")}
        return cls(**named, **given)


def check_messages(value: Any, where: str, column: str) -> list[dict]:
    """A list of role/content messages (content may be empty on an assistant tool call), or a DataError."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: column {column!r} must be a non-empty list of {{\"role\", \"content\"}} messages, "
                        f"got {type(value).__name__}")
    for index, message in enumerate(value):
        if not isinstance(message, dict) or "role" not in message:
            raise DataError(f"{where}: message {index} of {column!r} is not a {{\"role\", \"content\"}} pair "
                            f"(got {str(message)[:80]!r}): every message needs a role and a content")
        if message["role"] not in ROLES:
            raise DataError(f"{where}: message {index} has role {message['role']!r}: use one of {', '.join(ROLES)}")
        content = message.get("content")
        if content is None and not message.get("tool_calls"):
            raise DataError(f"{where}: message {index} ({message['role']}) has no content (and no tool_calls)")
        if content is not None and not isinstance(content, (str, list)):
            raise DataError(f"{where}: message {index} content must be text, got {type(content).__name__}")
    return value
