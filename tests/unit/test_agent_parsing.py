"""engine/rollout/multi_turn/parsing.py: tool calls in the Hermes format and through a tokenizer's response template."""

import pytest

from engine.rollout.multi_turn.parsing import ToolCall, parse_hermes, parse_turn


def test_plain_text_has_no_calls():
    turn = parse_hermes("  The answer is 7. ")
    assert turn.calls == () and not turn.malformed and turn.content == "The answer is 7."


def test_one_and_several_calls_with_the_text_around_them():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 4"}}\n</tool_call>'
            '\n<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"a\\"}"}</tool_call>')
    turn = parse_hermes(text)
    assert turn.calls == (ToolCall("calculator", {"expression": "3 + 4"}), ToolCall("lookup", {"key": "a"}))
    assert turn.content == "Let me compute." and not turn.malformed
    assert turn.calls[0].message() == {"type": "function",
                                       "function": {"name": "calculator", "arguments": {"expression": "3 + 4"}}}


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "calculator", "arguments": </tool_call>',  # not JSON
    '<tool_call>["calculator"]</tool_call>',  # not an object
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>',  # arguments not an object
    '<tool_call>{"name": "calculator", "arguments": {}}',  # unclosed
    '<tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>',  # a stray opening tag
])
def test_a_malformed_call_is_plain_text(text):
    turn = parse_hermes(text)
    assert turn.malformed and turn.calls == () and turn.content == text.strip()


class ResponseTemplateTokenizer:
    """STAND-IN for a tokenizer with a response template (transformers' ``parse_response``)."""

    response_template = {"x-regex": "..."}

    def __init__(self, message=None, raises=False):
        self.message, self.raises = message, raises

    def parse_response(self, text):
        if self.raises:
            raise ValueError("does not match")
        return self.message


def test_the_tokenizers_response_template_is_used_where_it_has_one():
    tokenizer = ResponseTemplateTokenizer({"role": "assistant", "content": "ok", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1 + 1"}}}]})
    turn = parse_turn("[whatever format the model uses]", tokenizer)
    assert turn.calls == (ToolCall("calculator", {"expression": "1 + 1"}),) and turn.content == "ok"
    assert parse_turn("no calls", ResponseTemplateTokenizer({"content": "no calls"})).calls == ()
    failed = parse_turn("<tool_call>broken", ResponseTemplateTokenizer(raises=True))
    assert failed.malformed and failed.calls == ()
    bad = parse_turn("x", ResponseTemplateTokenizer({"tool_calls": [{"function": {"name": 3}}]}))
    assert bad.malformed


def test_without_a_response_template_the_hermes_format_is_read():
    assert parse_turn('<tool_call>{"name": "f", "arguments": {}}</tool_call>', object()).calls == (ToolCall("f", {}),)
