"""Prompt datasets from files: JSONL, JSON, Parquet and ``datasets`` ``save_to_disk`` directories.

Rows are read as plain dicts, so the layouts of GSM8K (``question``/``answer``), verl (``prompt`` as chat
messages, ``reward_model.ground_truth``, ``data_source``, ``extra_info``) and TRL (``prompt`` as text or messages,
any extra columns) are accepted as they are. Every malformed row fails here, before training, with the file, the
row number and what is wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..train.rows import read_rows  # noqa: F401  (read here; tests and plugins import it from here)

# Tried in order when data.prompt_key / data.answer_key are not set.
PROMPT_KEYS = ("prompt", "question", "problem")
ANSWER_KEYS = ("reward_model.ground_truth", "answer", "solution", "ground_truth")
GSM8K_TEMPLATE = "Question: {question}\nAnswer: Let's think step by step."


@dataclasses.dataclass(frozen=True)
class Sample:
    """One prompt: what the model sees (``prompt``, the chat template applied) and what rewards read."""

    prompt: str
    answer: str | None = None
    raw_prompt: Any = None  # the row's prompt as in the file: text or a list of chat messages
    data_source: str = ""
    extra_info: Any = None
    row: dict = dataclasses.field(default_factory=dict, compare=False)  # all columns (TRL rewards get them)
    where: str = ""  # file:row, for error messages


def lookup(row: dict, key: str) -> Any:
    """``row["a"]["b"]`` for ``key="a.b"`` (verl's ``reward_model.ground_truth``); ``None`` when absent."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _first_present(rows: list[dict], keys: tuple[str, ...]) -> str | None:
    return next((key for key in keys if rows and lookup(rows[0], key) is not None), None)


def _check_messages(value: Any, where: str) -> list[dict]:
    if not value:
        raise ValueError(f"{where}: the prompt is an empty list of messages")
    for message in value:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise ValueError(f"{where}: prompt messages must be objects with string 'role' and 'content', got "
                             f"{message!r}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


class PromptFormatter:
    """Turns a row's prompt (text or messages) into the model's input text."""

    def __init__(self, tokenizer, chat_template: str = "auto", system_prompt: str | None = None) -> None:
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template not in ("auto", "none"):
            raise ValueError(f"data.chat_template must be auto or none, got {chat_template!r}")
        self.tokenizer = tokenizer
        self.use_template = chat_template == "auto" and has_template
        self.system_prompt = system_prompt

    def __call__(self, prompt: Any, where: str, from_question: bool = False) -> str:
        if isinstance(prompt, str):
            if not self.use_template:
                return GSM8K_TEMPLATE.format(question=prompt) if from_question else prompt
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = _check_messages(prompt, where)
        if not self.use_template:
            raise ValueError(f"{where}: the prompt is a list of chat messages but the tokenizer has no chat "
                             "template (or data.chat_template=none): give text prompts or a model with a template")
        if self.system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def load_samples(path: str, formatter: PromptFormatter, prompt_key: str | None = None,
                 answer_key: str | None = None, need_answer: bool = True) -> list[Sample]:
    """Read a file and check every row: its prompt, its answer (when the reward needs one), its shape."""
    rows = read_rows(path)
    if not rows:
        raise ValueError(f"data file {path} has no rows")
    prompt_key = prompt_key or _first_present(rows, PROMPT_KEYS)
    if prompt_key is None or lookup(rows[0], prompt_key) is None:
        columns = ", ".join(sorted(rows[0]))
        wanted = prompt_key or " or ".join(PROMPT_KEYS)
        raise ValueError(f"{path}: no prompt column {wanted} (columns: {columns}); set data.prompt_key")
    answer_key = answer_key or _first_present(rows, ANSWER_KEYS)
    if need_answer and answer_key is None:
        raise ValueError(f"{path}: no answer column ({' or '.join(ANSWER_KEYS)}; columns: "
                         f"{', '.join(sorted(rows[0]))}); set data.answer_key")
    samples = []
    for number, row in enumerate(rows, 1):
        where = f"{path}:{number}"
        prompt = lookup(row, prompt_key)
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError(f"{where}: empty prompt in column {prompt_key!r}")
        elif not isinstance(prompt, list):
            raise ValueError(f"{where}: column {prompt_key!r} must be text or a list of chat messages, got "
                             f"{type(prompt).__name__}")
        answer = lookup(row, answer_key) if answer_key else None
        if answer is not None and not isinstance(answer, str):
            answer = str(answer)
        if need_answer and (answer is None or not answer.strip()):
            raise ValueError(f"{where}: missing or empty answer in column {answer_key!r}")
        samples.append(Sample(prompt=formatter(prompt, where, from_question=prompt_key == "question"),
                              answer=answer, raw_prompt=prompt, data_source=str(row.get("data_source") or ""),
                              extra_info=row.get("extra_info"), row=row, where=where))
    return samples


def drop_long_prompts(samples: list[Sample], tokenizer, max_prompt_tokens: int | None, path: str,
                      verbose: bool = True) -> list[Sample]:
    """Drop prompts longer than ``max_prompt_tokens`` tokens; an empty result is an error."""
    if not max_prompt_tokens:
        return samples
    lengths = [len(ids) for ids in tokenizer([s.prompt for s in samples], add_special_tokens=False)["input_ids"]]
    kept = [s for s, n in zip(samples, lengths, strict=True) if n <= max_prompt_tokens]
    if not kept:
        raise ValueError(f"data.max_prompt_tokens={max_prompt_tokens} drops every prompt of {path} (the shortest "
                         f"has {min(lengths)} tokens): raise it")
    dropped = len(samples) - len(kept)
    if dropped and verbose:
        print(f"accel-grpo: {path}: dropped {dropped} of {len(samples)} prompts longer than "
              f"data.max_prompt_tokens={max_prompt_tokens}", flush=True)
    return kept


def split_validation(samples: list[Sample], fraction: float, seed: int) -> tuple[list[Sample], list[Sample]]:
    """(train, validation): a seeded random ``fraction`` of the rows held out."""
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed)).tolist()
    count = max(1, round(len(samples) * fraction))
    if count >= len(samples):
        raise ValueError(f"data.val_fraction={fraction} leaves no training rows out of {len(samples)}")
    held = set(order[:count])
    return [s for i, s in enumerate(samples) if i not in held], [s for i, s in enumerate(samples) if i in held]


class FileTask:
    """Prompts drawn with replacement from a list of samples."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def sample(self, count: int, generator: torch.Generator) -> list[Sample]:
        picks = torch.randint(0, len(self.samples), (count,), generator=generator).tolist()
        return [self.samples[i] for i in picks]
