"""A run's prompts: where its config enters data loading (``data_spec``, once), the files (JSONL, JSON, Parquet,
``datasets`` directories) read into ``Sample``s, the chat template applied, long prompts dropped, the validation
split; and the built-in tasks (the synthetic ``echo`` task, the GSM8K answer check as a data file's default reward).

Rows are read as plain dicts, so the layouts of GSM8K (``question``/``answer``), verl (``prompt`` as chat
messages, ``reward_model.ground_truth``, ``data_source``, ``extra_info``) and TRL (``prompt`` as text or messages,
any extra columns) are accepted as they are. Every malformed row fails here, before training, with the file, the
row number and what is wrong. Reward functions of every style are called by ``rewards.py``.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..train.rows import read_rows  # noqa: F401  (read here; tests and plugins import it from here)
from ..train.validation import split_validation  # the frame's: the same rows for every trainer
from . import reward_model
from .prompt_types import DataSpec, Sample
from .rewards import Reward, parse_specs

# Tried in order when data.prompt_key / data.answer_key are not set.
PROMPT_KEYS = ("prompt", "question", "problem")
ANSWER_KEYS = ("reward_model.ground_truth", "answer", "solution", "ground_truth")
GSM8K_TEMPLATE = "Question: {question}\nAnswer: Let's think step by step."


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


class FileTask:
    """Prompts drawn with replacement from a list of samples."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def sample(self, count: int, generator: torch.Generator) -> list[Sample]:
        picks = torch.randint(0, len(self.samples), (count,), generator=generator).tolist()
        return [self.samples[i] for i in picks]


# -- the synthetic task -------------------------------------------------------------------------------------------


class EchoTask:
    """Prompt ``"c x3:"`` asks for the letter ``c`` three times; the reward is the share of positions right.

    A random policy over the character vocabulary scores about 1/vocab; a policy that learned the task scores 1.
    It needs the prompt (which letter, how many), so it is a real conditional task, small enough for a 2-layer
    model trained from scratch by RL alone.
    """

    name = "echo"
    alphabet = "abcdefgh x0123456789:"

    def __init__(self, letters: str = "abcdefgh", max_repeat: int = 3) -> None:
        self.letters, self.max_repeat = letters, max_repeat

    def longest_prompt_chars(self) -> int:
        """No prompt is longer, in characters (so in tokens of a character or byte-level tokenizer)."""
        return len(f"{self.letters[0]} x{self.max_repeat}:")

    def sample(self, count: int, generator: torch.Generator) -> list[Sample]:
        letters = torch.randint(0, len(self.letters), (count,), generator=generator).tolist()
        repeats = torch.randint(1, self.max_repeat + 1, (count,), generator=generator).tolist()
        return [Sample(prompt=f"{self.letters[i]} x{n}:", answer=self.letters[i] * n)
                for i, n in zip(letters, repeats, strict=True)]


def echo_reward(prompt: str, response: str, answer: str) -> float:
    """Share of the answer's positions the response gets right; extra characters cost as much as wrong ones."""
    hits = sum(1 for got, want in zip(response, answer, strict=False) if got == want)
    return hits / max(len(answer), len(response), 1)


# -- GSM8K-style math ---------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> str | None:
    """The number after the last ``####`` if there is one, else the last number in the text (commas dropped)."""
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    numbers = _NUMBER.findall(tail)
    if not numbers:
        return None
    value = numbers[-1].replace(",", "")
    return value[:-2] if value.endswith(".0") else value


def gsm8k_reward(prompt: str, response: str, answer: str) -> float:
    """1.0 when the response's final number equals the reference's, else 0.0."""
    got, want = final_number(response), final_number(answer)
    return 1.0 if got is not None and got == want else 0.0


# -- wiring -------------------------------------------------------------------------------------------------------

BUILTIN_REWARDS = {"echo": "engine.rl.prompts:echo_reward",
                   "gsm8k": "engine.rl.prompts:gsm8k_reward"}


def data_spec(config) -> DataSpec:
    """The one place a run's config enters data loading (a bad ``data.reward`` / ``data.reward_weights`` raises)."""
    d = config.data
    with_model = reward_model.configured(config) is not None  # then it is a reward, the task's own is not
    rules = d.reward or ([] if with_model else BUILTIN_REWARDS[d.task])
    weights, _ = reward_model.split_weights(d.reward_weights, len([rules] if isinstance(rules, str) else rules),
                                            with_model)
    return DataSpec(path=d.path, val_path=d.val_path, val_fraction=d.val_fraction, prompt_key=d.prompt_key,
                    answer_key=d.answer_key, chat_template=d.chat_template, system_prompt=d.system_prompt,
                    max_prompt_tokens=d.max_prompt_tokens, seed=config.train.seed,
                    rewards=tuple(parse_specs(rules, weights)),
                    reward_style=d.reward_style)


def needs_answers(rewards: list[Reward]) -> bool:
    """Whether every row must have an answer column: only TRL-style rewards do without one."""
    return any(reward.style not in ("trl", reward_model.STYLE) for reward in rewards)


def build_tasks(spec: DataSpec, tokenizer, need_answer: bool = True, verbose: bool = True):
    """(training task, validation samples or None): the echo task, or the prompts of ``spec.path``."""
    if not spec.path:
        return EchoTask(), None
    formatter = _formatter(spec, tokenizer, verbose)
    train = _load(spec, spec.path, formatter, tokenizer, need_answer, verbose)
    validation = _load(spec, spec.val_path, formatter, tokenizer, need_answer, verbose) if spec.val_path else None
    if validation is None and spec.val_fraction:
        train, validation = split_validation(train, spec.val_fraction, spec.seed)
    return FileTask(train), validation


def validation_set(spec: DataSpec, tokenizer, need_answer: bool = True, verbose: bool = True) -> list[Sample] | None:
    """The held-out prompts as in-run validation reads them: ``spec.val_path``, or the ``spec.val_fraction`` share
    of ``spec.path`` (``accel-grpo eval``)."""
    if spec.path:
        return build_tasks(spec, tokenizer, need_answer, verbose)[1]
    if not spec.val_path:
        return None
    formatter = PromptFormatter(tokenizer, spec.chat_template, spec.system_prompt)
    return _load(spec, spec.val_path, formatter, tokenizer, need_answer, verbose)


def _formatter(spec: DataSpec, tokenizer, verbose: bool) -> PromptFormatter:
    formatter = PromptFormatter(tokenizer, spec.chat_template, spec.system_prompt)
    if spec.chat_template == "auto" and not formatter.use_template and verbose:
        print("accel-grpo: the tokenizer has no chat template: prompts are used as plain text", flush=True)
    return formatter


def _load(spec: DataSpec, path: str, formatter: PromptFormatter, tokenizer, need_answer: bool,
          verbose: bool) -> list[Sample]:
    samples = load_samples(path, formatter, spec.prompt_key, spec.answer_key, need_answer)
    return drop_long_prompts(samples, tokenizer, spec.max_prompt_tokens, path, verbose)
