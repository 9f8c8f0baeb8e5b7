"""The chat template between turns: the prompt's tokens, and the tokens of tool results as the template renders
them, taken as the difference between its rendering of the conversation with and without them. Earlier turns are
never re-tokenized: each turn continues from exactly the tokens the model produced.

That is only right when the template is prefix-preserving: rendering more messages must not change the text of
the earlier ones (Qwen3's template, for one, drops earlier turns' reasoning). ``check_template`` renders a
conversation with a tool call at start-up and refuses a template that is not, naming what changed.
"""

from __future__ import annotations

PROBE_ARGUMENTS = {"x": "1"}


def render(tokenizer, messages: list[dict], tools: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict]) -> list[int]:
    """The first turn's input: the conversation with the tool schemas and the assistant's generation prompt."""
    return encode(tokenizer, render(tokenizer, messages, tools, True))


def inserted_text(tokenizer, before: list[dict], added: list[dict], tools: list[dict], end_text: str) -> str | None:
    """The text the template puts after the model's last token (``end_text``, its decoded end-of-turn token) up to
    the next generation prompt once ``added`` (tool messages) follow ``before`` (ending with the assistant's
    turn). ``None`` when the model's end token is not where the template ends the assistant's turn."""
    short = render(tokenizer, before, tools, False)
    long = render(tokenizer, before + added, tools, True)
    cut = short.rfind(end_text) if end_text else -1
    if cut < 0 or not long.startswith(short[:cut + len(end_text)]):
        return None
    return long[cut + len(end_text):]


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def check_template(tokenizer, tools: list[dict], where: str) -> list[str]:
    """Problems with the tokenizer's chat template for multi-turn tool use (one sentence each): none, no tool
    support, or not prefix-preserving for the assistant's turn or for tool messages."""
    if not getattr(tokenizer, "chat_template", None):
        return [f"rollout.tools / rollout.environment need a chat template that renders tools, and the tokenizer of "
                f"{where} has none: use an instruction-tuned model whose template takes tools (Qwen2.5-Instruct, "
                "Hermes...)"]
    name = tools[0]["function"]["name"] if tools else "tool"
    user = [{"role": "user", "content": "question"}]
    call = {"type": "function", "function": {"name": name, "arguments": PROBE_ARGUMENTS}}
    assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"role": "tool", "name": name, "content": "TOOL-RESULT-42"}
    try:
        with_tools = render(tokenizer, user, tools, True)
        without = render(tokenizer, user, [], True)
        turn = render(tokenizer, [*user, assistant], tools, False)
        after = render(tokenizer, [*user, assistant, result], tools, True)
    except Exception as exc:  # noqa: BLE001 - a template raises its own errors for roles it does not know
        return [f"the chat template of {where} cannot render a tool call and a tool message ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}): use a model whose template supports tools"]
    if with_tools == without or name not in with_tools:
        return [f"the chat template of {where} ignores the tools= argument (the tool schemas do not appear in the "
                "prompt): use a model whose template renders tools"]
    if "TOOL-RESULT-42" not in after:
        return [f"the chat template of {where} does not render tool messages (role 'tool'): use a model whose "
                "template supports them"]
    problems = []
    if not turn.startswith(with_tools):
        at = _first_difference(with_tools, turn)
        problems.append(f"the chat template of {where} is not prefix-preserving for the assistant's turn: the prompt "
                        f"with its generation prompt ends {with_tools[max(0, at - 20):at + 20]!r}... but the "
                        f"conversation with the assistant's message reads {turn[max(0, at - 20):at + 20]!r} there "
                        f"(char {at}); the model's tokens would not continue the prompt: use a template that renders "
                        "earlier messages unchanged")
    end_text = tokenizer.eos_token or ""
    if inserted_text(tokenizer, [*user, assistant], [result], tools, end_text) is None:
        at = _first_difference(turn, after)
        problems.append(f"the chat template of {where} is not prefix-preserving for tool messages: adding a tool "
                        f"result changes the text before it (char {at}: {turn[max(0, at - 20):at + 20]!r} becomes "
                        f"{after[max(0, at - 20):at + 20]!r}), or the assistant's turn does not end with the EOS "
                        f"token {end_text!r}; multi-turn rollouts continue from the tokens already produced and "
                        "need a template that renders earlier messages unchanged")
    return problems
