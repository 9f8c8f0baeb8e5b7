"""Preference pairs in TRL's formats, checked row by row before any worker starts, and tokenized.

A row holds a ``chosen`` and a ``rejected`` response (``data.chosen_key`` / ``data.rejected_key``), both text or both
conversations (lists of ``{"role", "content"}`` messages), and

* an explicit prompt (``data.prompt_key``): text with text responses, a conversation with conversational ones
  (the responses are then the assistant turns that follow it); or
* no prompt column (the implicit-prompt form): the prompt is what chosen and rejected share from their start, the
  longest common prefix of their messages (or of their characters, for text), as TRL's ``extract_prompt`` takes it.

Optional: the row's ``tools`` schemas (``data.tools_key``), passed to the chat template, and a per-pair margin (a
reward model's ``rm.margin_key``). Each response is tokenized after its prompt as a prompt-completion example
(``masks.tokenize_example``): the scored tokens are the response's, with the EOS appended to text, the end of turn
for conversations.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..train.rows import read_rows
from .masks import Tokenized, fit_length, tokenize_example
from .messages import Columns, DataError, Example, check_messages


@dataclasses.dataclass
class PairColumns(Columns):
    chosen: str = "chosen"
    rejected: str = "rejected"
    margin: str | None = None  # a reward model's per-pair margin column (rm.margin_key)


@dataclasses.dataclass
class Pair:
    """One checked row: the prompt (text or messages; the shared prefix in the implicit form) and two responses."""

    where: str  # file:row
    prompt: Any
    chosen: Any
    rejected: Any
    tools: list | None = None
    margin: float | None = None
    implicit: bool = False  # the prompt was taken from what chosen and rejected share

    @property
    def conversational(self) -> bool:
        return isinstance(self.chosen, list)


@dataclasses.dataclass
class TokenizedPair:
    chosen: Tokenized
    rejected: Tokenized
    margin: float | None = None

    @property
    def where(self) -> str:
        return self.chosen.where

    @property
    def tokens(self) -> int:
        return len(self.chosen.ids) + len(self.rejected.ids)


def _common_prefix(first, second) -> int:
    count = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        count += 1
    return count


def split_implicit(chosen: Any, rejected: Any, where: str) -> tuple[Any, Any, Any]:
    """``(prompt, chosen, rejected)`` of a row without a prompt: the prefix both responses share, and the rest."""
    shared = _common_prefix(chosen, rejected)
    if isinstance(chosen, list):
        if shared == 0:
            raise DataError(f"{where}: chosen and rejected share no first message, so the prompt cannot be found: "
                            "give the row a prompt column (data.prompt_key) or start both with the same messages")
        if shared == min(len(chosen), len(rejected)):
            raise DataError(f"{where}: one of chosen and rejected is the other's beginning, so no response is left "
                            "after the prompt they share: each needs its own final assistant turn")
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _margin(row: dict, column: str, where: str) -> float:
    if column not in row:
        raise DataError(f"{where}: no margin column {column!r} (columns: {', '.join(sorted(row))}): set "
                        "rm.margin_key to the column that holds it, or null for no margin")
    value = row[column]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataError(f"{where}: the margin {column!r} must be a finite number, got {value!r}")
    return float(value)


def to_pair(row: dict, columns: PairColumns, where: str) -> Pair:
    """A row as a ``Pair``, or a DataError naming the row and what to do."""
    for name, option in ((columns.chosen, "chosen_key"), (columns.rejected, "rejected_key")):
        if name not in row:
            raise DataError(f"{where}: no column {name!r} (columns: {', '.join(sorted(row))}): set data.{option}= to "
                            "the column that holds it, or fix the row")
    chosen, rejected = row[columns.chosen], row[columns.rejected]
    if isinstance(chosen, list) and isinstance(rejected, list):
        check_messages(chosen, where, columns.chosen)
        check_messages(rejected, where, columns.rejected)
    elif not (isinstance(chosen, str) and isinstance(rejected, str)):
        raise DataError(f"{where}: chosen and rejected must both be text or both be message lists, got "
                        f"{type(chosen).__name__} and {type(rejected).__name__}")
    if columns.prompt in row:
        prompt = row[columns.prompt]
        if isinstance(chosen, list):
            if not isinstance(prompt, list):
                raise DataError(f"{where}: conversational responses need a conversational prompt (a message list), "
                                f"got {type(prompt).__name__}")
            check_messages(prompt, where, columns.prompt)
        elif not isinstance(prompt, str):
            raise DataError(f"{where}: text responses need a text prompt, got {type(prompt).__name__}")
    else:
        prompt, chosen, rejected = split_implicit(chosen, rejected, where)
    margin = _margin(row, columns.margin, where) if columns.margin else None
    return Pair(where, prompt, chosen, rejected, row.get(columns.tools) or None, margin, columns.prompt not in row)


def load_pairs(path: str, columns: PairColumns) -> list[Pair]:
    """Every row of ``path`` (JSONL, JSON, Parquet or a ``datasets`` directory) as a checked pair."""
    rows = read_rows(path)
    if not rows:
        raise DataError(f"{path} holds no rows")
    return [to_pair(row, columns, f"{path}:{number}") for number, row in enumerate(rows, 1)]


def tokenize_pair(pair: Pair, tokenizer) -> TokenizedPair:
    """Both responses after the prompt, each scored on its own tokens (a prompt-completion example)."""
    def side(response, name):
        example = Example(f"{pair.where} ({name})", prompt=pair.prompt, completion=response, tools=pair.tools)
        return tokenize_example(example, tokenizer, "completion")

    return TokenizedPair(side(pair.chosen, "chosen"), side(pair.rejected, "rejected"), pair.margin)


def fit_pair(pair: TokenizedPair, max_length: int, truncation: str) -> TokenizedPair | None:
    """Both sequences within ``max_length`` tokens (``masks.fit_length``); None when a side is dropped or the cut
    leaves it no response token."""
    chosen, rejected = (fit_length(side, max_length, truncation) for side in (pair.chosen, pair.rejected))
    if chosen is None or rejected is None or not chosen.supervised or not rejected.supervised:
        return None
    return TokenizedPair(chosen, rejected, pair.margin)
