"""A run's tokenized training and validation sets: read, checked, tokenized with loss masks, fitted to
``data.max_length``, and split. One function, called in the launching process first (so that bad input fails
before any worker starts) and then by every worker (the same result from the same inputs)."""

from __future__ import annotations

import dataclasses
import random

from ...masks import Tokenized, fit_length, tokenize_example
from ...split import held_out
from .data import Columns, DataError, Example, load_examples

DEMO_VAL_FRACTION = 0.03  # the demo task's held-out share (data.val_fraction overrides it)
_DEMO_ITEMS = "apples oranges books pencils cookies marbles cars trees friends students dollars boxes".split()
_DEMO_PLACES = "garden school shop basket bag box week month".split()


def demo_examples(count: int, seed: int = 0) -> list[Example]:
    """The CPU demo's synthetic chat task: the user asks how many of an item there are somewhere; the answer is a
    fixed number for each item, whatever the place (a lookup the model learns), followed by the item's name."""
    rng = random.Random(seed)
    examples = []
    for index in range(count):
        item_index = rng.randrange(len(_DEMO_ITEMS))
        item, place = _DEMO_ITEMS[item_index], rng.choice(_DEMO_PLACES)
        messages = [{"role": "user", "content": f"how many {item} are in the {place}?"},
                    {"role": "assistant", "content": f"{(item_index * 37) % 90 + 10} {item}"}]
        examples.append(Example(f"demo:{index + 1}", messages=messages))
    return examples


def resolve_loss_on(loss_on: str, fmt: str) -> str:
    if loss_on != "auto":
        return loss_on
    return {"messages": "assistant", "prompt_completion": "completion", "text": "all"}[fmt]


@dataclasses.dataclass
class SFTData:
    train: list[Tokenized]
    val: list[Tokenized]
    format: str
    loss_on: str
    dropped_long: int = 0
    dropped_empty: int = 0
    truncated: int = 0
    system_prompt: str | None = None  # the system message every training conversation begins with, if they share one

    def summary(self) -> str:
        parts = [f"{len(self.train)} training examples", f"{len(self.val)} validation",
                 f"format {self.format}", f"loss on {self.loss_on}"]
        for count, what in ((self.truncated, "cut to data.max_length"), (self.dropped_long, "dropped as too long"),
                            (self.dropped_empty, "dropped with no supervised token")):
            if count:
                parts.append(f"{count} {what}")
        return ", ".join(parts)


def _tokenize_all(examples: list[Example], tokenizer, loss_on: str, d, data: SFTData) -> list[Tokenized]:
    kept = []
    for example in examples:
        item = tokenize_example(example, tokenizer, loss_on)
        fitted = fit_length(item, d.max_length, d.truncation)
        if fitted is None:
            data.dropped_long += 1
            continue
        data.truncated += fitted is not item
        if fitted.supervised == 0:
            if d.empty_mask == "drop":
                data.dropped_empty += 1
                continue
            cut = " after data.max_length cut it" if fitted is not item else ""
            raise DataError(f"{example.where}: no token gets the loss{cut} (train.loss_on={loss_on}): raise "
                            "data.max_length, fix the row, or set data.empty_mask=drop to skip such rows (counted)")
        kept.append(fitted)
    return kept


def shared_system_prompt(examples: list[Example]) -> str | None:
    """The system message every conversation begins with, when they all begin with the same one."""
    found = set()
    for example in examples:
        messages = example.messages if example.messages is not None else example.prompt
        if not isinstance(messages, list) or not messages or messages[0].get("role") != "system":
            return None
        found.add(str(messages[0].get("content")))
        if len(found) > 1:
            return None
    return found.pop() if found else None


def build_data(data_config, loss_on: str, tokenizer, seed: int) -> SFTData:
    d, columns = data_config, Columns.of(data_config)
    if d.path:
        examples, fmt = load_examples(d.path, d.format, columns)
    else:
        examples, fmt = demo_examples(d.demo_examples, seed), "messages"
    val_examples: list[Example] = []
    if d.val_path:
        val_examples, _ = load_examples(d.val_path, fmt, columns)
    else:
        examples, val_examples = held_out(examples, d.val_fraction, seed, None if d.path else DEMO_VAL_FRACTION)
    resolved = resolve_loss_on(loss_on, fmt)
    data = SFTData([], [], fmt, resolved, system_prompt=shared_system_prompt(examples))
    data.train = _tokenize_all(examples, tokenizer, resolved, d, data)
    data.val = _tokenize_all(val_examples, tokenizer, resolved, d, data)
    if not data.train:
        raise DataError(f"no training example left ({data.summary()}): check data.max_length and data.empty_mask")
    return data
