"""A run's preference pairs (DPO, reward models): the ``data.*`` section, the demo task, and the tokenized training
and validation sets: read, checked, tokenized, fitted to ``data.max_length`` and split. Called in the launching
process first (bad input fails before any worker starts) and then by every worker (the same result)."""

from __future__ import annotations

import copy
import dataclasses
import random

from .messages import DataError
from .pairs import Pair, PairColumns, TokenizedPair, fit_pair, load_pairs, tokenize_pair
from .split import held_out

TRUNCATIONS = ("keep_start", "drop", "error")
DEMO_VAL_FRACTION = 0.1  # the demo task's held-out share (data.val_fraction overrides it)
_DEMO_ITEMS = "apples oranges books pencils cookies marbles cars trees friends students dollars boxes".split()
_DEMO_PLACES = "garden school shop basket bag box week month".split()


@dataclasses.dataclass
class PairDataConfig:
    path: str | None = None  # JSONL, JSON, Parquet file or a datasets save_to_disk directory; null: the demo task
    prompt_key: str = "prompt"  # absent from a row: the implicit-prompt form (the prefix chosen and rejected share)
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    tools_key: str = "tools"  # a row's tool schemas, passed to the chat template when present
    max_length: int = 1024  # tokens per sequence (prompt + one response)
    truncation: str = "keep_start"  # longer sequences: keep_start (cut the end), drop (the pair, counted), error
    val_path: str | None = None
    val_fraction: float = 0.0  # or hold out this share of data.path; data.val_path wins (the demo task: 10%)
    demo_pairs: int = 1024  # the demo task's size


def demo_answer(item_index: int) -> int:
    """The number the demo's user wants for item ``item_index`` (a lookup the model learns)."""
    return (item_index * 37) % 90 + 10


_DEMO_WRONG = [n for n in range(10, 100) if n not in {demo_answer(i) for i in range(len(_DEMO_ITEMS))}]  # no item's


def demo_pairs(count: int, seed: int = 0) -> list[Pair]:
    """The CPU demos' synthetic preferences: the user asks how many of an item there are somewhere; the preferred
    answer is that item's own number (``demo_answer``), the rejected one a number that is no item's; both name the
    item."""
    rng = random.Random(seed)
    pairs = []
    for index in range(count):
        item_index = rng.randrange(len(_DEMO_ITEMS))
        item, place = _DEMO_ITEMS[item_index], rng.choice(_DEMO_PLACES)
        right = demo_answer(item_index)
        wrong = rng.choice(_DEMO_WRONG)
        prompt = [{"role": "user", "content": f"how many {item} are in the {place}?"}]
        pairs.append(Pair(f"demo:{index + 1}", prompt, [{"role": "assistant", "content": f"{right} {item}"}],
                          [{"role": "assistant", "content": f"{wrong} {item}"}]))
    return pairs


@dataclasses.dataclass
class PairData:
    train: list[TokenizedPair]
    val: list[TokenizedPair]
    conversational: bool
    implicit_prompt: bool
    dropped: int = 0  # too long (data.truncation=drop), or a response cut to nothing
    equal: int = 0  # chosen and rejected the same tokens: nothing to prefer

    def summary(self) -> str:
        kind = "conversations" if self.conversational else "text"
        prompt = "implicit prompt (the prefix both share)" if self.implicit_prompt else "explicit prompt"
        parts = [f"{len(self.train)} training pairs", f"{len(self.val)} validation", f"{kind}, {prompt}"]
        for count, what in ((self.dropped, "dropped as too long for data.max_length"),
                            (self.equal, "dropped with chosen equal to rejected")):
            if count:
                parts.append(f"{count} {what}")
        return ", ".join(parts)


def _tokenize_all(pairs: list[Pair], tokenizer, d: PairDataConfig, data: PairData) -> list[TokenizedPair]:
    kept = []
    for pair in pairs:
        tokenized = tokenize_pair(pair, tokenizer)
        fitted = fit_pair(tokenized, d.max_length, d.truncation)
        if fitted is None:
            data.dropped += 1
        elif fitted.chosen.ids == fitted.rejected.ids:
            data.equal += 1
        else:
            kept.append(fitted)
    return kept


def build_pairs(d: PairDataConfig, tokenizer, seed: int, margin_key: str | None = None) -> PairData:
    """The run's tokenized pairs: ``data.path`` (or the demo task) split by ``data.val_path`` / ``val_fraction``."""
    columns = PairColumns.of(d, margin=margin_key)
    if d.path:
        pairs = load_pairs(d.path, columns)
    else:
        pairs = demo_pairs(d.demo_pairs, seed)
    val_pairs: list[Pair] = []
    if d.val_path:
        val_pairs = load_pairs(d.val_path, columns)
    else:
        pairs, val_pairs = held_out(pairs, d.val_fraction, seed, None if d.path else DEMO_VAL_FRACTION)
    kinds = {pair.conversational for pair in pairs + val_pairs}
    if len(kinds) > 1:
        odd = next(p for p in pairs + val_pairs if p.conversational != pairs[0].conversational)
        raise DataError(f"{odd.where}: its responses are {'conversations' if odd.conversational else 'text'}, unlike "
                        "the first row's: a data set is all text or all conversations")
    data = PairData([], [], pairs[0].conversational, any(pair.implicit for pair in pairs))
    data.train = _tokenize_all(pairs, tokenizer, d, data)
    data.val = _tokenize_all(val_pairs, tokenizer, d, data)
    if not data.train:
        raise DataError(f"no training pair left ({data.summary()}): check data.max_length and data.truncation")
    return data


def evaluation_pairs(d: PairDataConfig, tokenizer, seed: int, margin_key: str | None = None) -> list[TokenizedPair]:
    """The pairs an eval scores: ``data.val_path`` alone, or the run's held-out share."""
    if d.val_path:
        alone = copy.deepcopy(d)
        alone.path, alone.val_path, alone.val_fraction = d.val_path, None, 0.0
        return build_pairs(alone, tokenizer, seed, margin_key).train
    return build_pairs(d, tokenizer, seed, margin_key).val
