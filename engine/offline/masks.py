"""Token ids and loss masks: which tokens of an example get the loss (``loss_on``; SFT's ``train.loss_on``, the
completions of DPO's pairs).

* Conversations (``assistant``): every assistant turn's content and its end-of-turn token, never the
  ``<|im_start|>assistant`` header nor anything else. From the chat template's generation markers
  (``{% generation %}``, transformers' ``return_assistant_tokens_mask``) where the template has them; else by
  rendering the conversation turn by turn (the text before each assistant turn with the generation prompt, the
  text through that turn) and checking that the pieces, tokenized one by one, reproduce the tokens of the whole
  conversation exactly. A template whose pieces do not (one that rewrites earlier turns, say) is an error, never a
  silently wrong mask. Whatever follows the turn's last special token inside its piece (Qwen's newline after
  ``<|im_end|>``) is not trained: the model must learn to stop, not to print what the template adds next.
* Prompt-completion (``completion``; also a preference pair's chosen and rejected responses): the completion and its
  end (the EOS appended to a text completion; a conversational completion as assistant turns of the conversation
  prompt + completion).
* ``all``: every token (text datasets).
"""

from __future__ import annotations

import dataclasses
import re

from .messages import DataError, Example

GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclasses.dataclass
class Tokenized:
    ids: list[int]
    mask: list[int]  # 1: the token gets the loss (it is predicted from the tokens before it)
    where: str

    @property
    def supervised(self) -> int:
        return sum(self.mask[1:])  # the first token has nothing before it to be predicted from


def has_generation_markers(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and bool(GENERATION_MARKER.search(template))


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _render(tokenizer, messages: list[dict], tools, generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def _trim_after_end_of_turn(ids: list[int], mask: list[int], start: int, end: int, specials: set[int]) -> None:
    """Untrain what follows the last special token of the piece ``ids[start:end]`` (a template's newline)."""
    for index in range(end - 1, start - 1, -1):
        if ids[index] in specials:
            for after in range(index + 1, end):
                mask[after] = 0
            return


def conversation_mask_from_markers(tokenizer, messages: list[dict], tools, where: str) -> tuple[list[int], list[int]]:
    encoded = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
    ids = list(encoded["input_ids"])
    mask = [int(m) for m in encoded["assistant_masks"]]
    return ids, mask


def conversation_mask_by_turns(tokenizer, messages: list[dict], tools, where: str,
                               turns: list[int] | None = None) -> tuple[list[int], list[int]]:
    """Ids and mask by rendering turn by turn; ``turns``: the assistant messages to train (default: all)."""
    full = _render(tokenizer, messages, tools)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"] if turns is None else turns
    bounds = []  # (start char, end char) of each trained assistant turn in ``full``
    for index in turns:
        before = _render(tokenizer, messages[:index], tools, generation_prompt=True) if index else ""
        through = _render(tokenizer, messages[:index + 1], tools)
        if not (full.startswith(through) and through.startswith(before)) or len(through) <= len(before):
            raise DataError(f"{where}: the chat template cannot produce an assistant mask for turn {index}: the "
                            "conversation rendered up to that turn is not a prefix of the whole (the template "
                            "rewrites earlier turns). Use a template with {% generation %} markers, or "
                            "train.loss_on=all")
        bounds.append((len(before), len(through)))
    ids, mask, cursor = [], [], 0
    for start, end in bounds:
        for text, trained in ((full[cursor:start], 0), (full[start:end], 1)):
            piece = _encode(tokenizer, text) if text else []
            ids += piece
            mask += [trained] * len(piece)
            if trained:
                _trim_after_end_of_turn(ids, mask, len(ids) - len(piece), len(ids), set(tokenizer.all_special_ids))
        cursor = end
    tail = _encode(tokenizer, full[cursor:]) if full[cursor:] else []
    ids += tail
    mask += [0] * len(tail)
    if ids != _encode(tokenizer, full):
        raise DataError(f"{where}: the chat template's turns, tokenized one by one, do not reproduce the tokens of the "
                        "whole conversation (a token crosses a turn boundary), so no exact assistant mask exists: "
                        "use a template with {% generation %} markers, or train.loss_on=all")
    return ids, mask


def tokenize_example(example: Example, tokenizer, loss_on: str) -> Tokenized:
    """``example`` as ids and a loss mask (see the module docstring). ``loss_on`` is resolved (not auto)."""
    where = example.where
    eos = tokenizer.eos_token_id
    if example.text is not None:
        ids = _encode(tokenizer, example.text)
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        if loss_on != "all":
            raise DataError(f"{where}: a text example has no assistant turn or completion: use train.loss_on=all")
        return Tokenized(ids, [1] * len(ids), where)
    if isinstance(example.prompt, str):
        prompt, completion = _encode(tokenizer, example.prompt), _encode(tokenizer, example.completion)
        if eos is not None and (not completion or completion[-1] != eos):
            completion.append(eos)
        trained = 1 if loss_on == "all" else 0
        if loss_on == "assistant":
            raise DataError(f"{where}: a text prompt-completion has no assistant turn: use train.loss_on=completion")
        return Tokenized(prompt + completion, [trained] * len(prompt) + [1] * len(completion), where)
    if tokenizer.chat_template is None:
        raise DataError(f"{where}: conversational data needs a chat template, and the model's tokenizer has none: "
                        "add one (tokenizer_config.json chat_template) or use text data")
    messages = example.messages if example.messages is not None else [*example.prompt, *example.completion]
    if loss_on == "all":
        ids = _encode(tokenizer, _render(tokenizer, messages, example.tools))
        return Tokenized(ids, [1] * len(ids), where)
    first = 0 if example.messages is not None else len(example.prompt)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= first]
    if not turns:
        raise DataError(f"{where}: the completion has no assistant message, so nothing would be trained")
    if has_generation_markers(tokenizer):
        ids, mask = conversation_mask_from_markers(tokenizer, messages, example.tools, where)
        if first:  # a conversational prompt's own assistant turns are context, not training targets
            prompt_ids = _encode(tokenizer, _render(tokenizer, messages[:first], example.tools, True))
            mask = [0] * min(len(prompt_ids), len(mask)) + mask[len(prompt_ids):]
        if not any(mask):
            raise DataError(f"{where}: the chat template's generation markers marked no assistant token: fix the "
                            "template's {% generation %} block, or train.loss_on=all")
        return Tokenized(ids, mask, where)
    ids, mask = conversation_mask_by_turns(tokenizer, messages, example.tools, where, turns)
    return Tokenized(ids, mask, where)


def fit_length(item: Tokenized, max_length: int, truncation: str) -> Tokenized | None:
    """``item`` within ``max_length`` tokens: cut (keep_start), dropped (``None``: drop), or a DataError."""
    if len(item.ids) <= max_length:
        return item
    if truncation == "error":
        raise DataError(f"{item.where}: {len(item.ids)} tokens, above data.max_length={max_length}: raise "
                        "data.max_length, or set data.truncation=keep_start (cut the end) or drop")
    if truncation == "drop":
        return None
    return Tokenized(item.ids[:max_length], item.mask[:max_length], item.where)
