"""SFT examples from rows as users have them, in TRL's dataset formats:

* ``text``: one column of plain text (language modelling; every token trained);
* ``messages``: a conversation, a list of ``{"role", "content"}`` messages (system, user, assistant, tool; an
  assistant message may carry ``tool_calls``), optionally with the row's ``tools`` schemas;
* ``prompt_completion``: a prompt and its completion, both text or both message lists.

``data.format=auto`` picks the format from the columns of the first row and says which it chose. Every row is
checked here, before any worker starts: a bad one fails with ``file:row`` and what to do.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ....train.rows import read_rows
from ...messages import Columns as RowColumns
from ...messages import DataError, Example, check_messages


@dataclasses.dataclass
class Columns(RowColumns):
    text: str = "text"
    messages: str = "messages"
    completion: str = "completion"


def detect_format(row: dict, columns: Columns, where: str) -> str:
    """The format a row's columns say: messages, then prompt_completion, then text."""
    if columns.messages in row:
        return "messages"
    if columns.prompt in row and columns.completion in row:
        return "prompt_completion"
    if columns.text in row:
        return "text"
    raise DataError(f"{where}: cannot tell the data format from the columns {sorted(row)}: expected "
                    f"{columns.messages!r} (messages), {columns.prompt!r} + {columns.completion!r} "
                    f"(prompt_completion) or {columns.text!r} (text); set data.format and data.*_key to name yours")


def to_example(row: dict, fmt: str, columns: Columns, where: str) -> Example:
    def column(name: str) -> Any:
        if name not in row:
            raise DataError(f"{where}: no column {name!r} (columns: {', '.join(sorted(row))}): set data."
                            f"{_key_option(name, columns)}= to the column that holds it, or fix the row")
        return row[name]

    tools = row.get(columns.tools) or None
    if fmt == "text":
        text = column(columns.text)
        if not isinstance(text, str) or not text:
            raise DataError(f"{where}: column {columns.text!r} must be non-empty text, got {type(text).__name__}")
        return Example(where, text=text)
    if fmt == "messages":
        messages = check_messages(column(columns.messages), where, columns.messages)
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: the conversation has no assistant turn, so nothing would be trained: add "
                            "one, or drop the row")
        return Example(where, messages=messages, tools=tools)
    prompt, completion = column(columns.prompt), column(columns.completion)
    if isinstance(prompt, str) and isinstance(completion, str):
        if not completion:
            raise DataError(f"{where}: the completion is empty: nothing would be trained")
        return Example(where, prompt=prompt, completion=completion)
    if isinstance(prompt, list) and isinstance(completion, list):
        check_messages(prompt, where, columns.prompt)
        check_messages(completion, where, columns.completion)
        return Example(where, prompt=prompt, completion=completion, tools=tools)
    raise DataError(f"{where}: prompt and completion must both be text or both be message lists, got "
                    f"{type(prompt).__name__} and {type(completion).__name__}")


def _key_option(name: str, columns: Columns) -> str:
    for option in ("text", "messages", "prompt", "completion"):
        if getattr(columns, option) == name:
            return f"{option}_key"
    return "tools_key"


def load_examples(path: str, fmt: str, columns: Columns) -> tuple[list[Example], str]:
    """Every row of ``path`` as an example, and the format used (``auto`` resolved from the first row)."""
    rows = read_rows(path)
    if not rows:
        raise DataError(f"{path} holds no rows")
    chosen = detect_format(rows[0], columns, f"{path}:1") if fmt == "auto" else fmt
    examples = [to_example(row, chosen, columns, f"{path}:{number}") for number, row in enumerate(rows, 1)]
    return examples, chosen
