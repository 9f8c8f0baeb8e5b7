"""Tool calls in a model turn: the Qwen/Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
format, or the tokenizer's own response template (``tokenizer.parse_response``) where it has one.

A turn is either plain text (no call), a list of calls, or malformed (a block that is not a JSON object with a
``name`` and object ``arguments``, or an unclosed block): a malformed turn is treated as plain text, so the
trajectory ends there with the text as the model's answer.
"""

from __future__ import annotations

import dataclasses
import json
import re

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict

    def message(self) -> dict:
        """The call as an assistant message's ``tool_calls`` entry (the chat-template convention)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    content: str  # the turn's text outside the calls
    calls: tuple[ToolCall, ...] = ()
    malformed: bool = False


def _call(name, arguments) -> ToolCall | None:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall(name, arguments)


def parse_hermes(text: str) -> ParsedTurn:
    """Every ``<tool_call>`` block of ``text``."""
    if OPEN not in text:
        return ParsedTurn(text.strip())
    calls = []
    for block in _BLOCK.findall(text):
        try:
            body = json.loads(block.strip())
        except json.JSONDecodeError:
            return ParsedTurn(text.strip(), malformed=True)
        call = _call(body.get("name"), body.get("arguments", body.get("parameters"))) if isinstance(body, dict) \
            else None
        if call is None:
            return ParsedTurn(text.strip(), malformed=True)
        calls.append(call)
    rest = _BLOCK.sub("", text)
    if OPEN in rest or CLOSE in rest or not calls:  # an unclosed or stray block
        return ParsedTurn(text.strip(), malformed=True)
    return ParsedTurn(rest.strip(), tuple(calls))


def has_response_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None))


def parse_with_tokenizer(tokenizer, text: str) -> ParsedTurn:
    """Through the tokenizer's response template (transformers' ``parse_response``)."""
    try:
        message = tokenizer.parse_response(text)
    except Exception:  # noqa: BLE001 - the template's parser rejects what does not match: plain text
        return ParsedTurn(text.strip(), malformed=OPEN in text)
    content = message.get("content") or ""
    calls = []
    for entry in message.get("tool_calls") or []:
        function = entry.get("function", entry) if isinstance(entry, dict) else None
        call = _call(function.get("name"), function.get("arguments")) if isinstance(function, dict) else None
        if call is None:
            return ParsedTurn(text.strip(), malformed=True)
        calls.append(call)
    return ParsedTurn(str(content).strip(), tuple(calls))


def parse_turn(text: str, tokenizer=None) -> ParsedTurn:
    """The tokenizer's response template when it has one, else the Hermes format."""
    if tokenizer is not None and has_response_template(tokenizer):
        return parse_with_tokenizer(tokenizer, text)
    return parse_hermes(text)
