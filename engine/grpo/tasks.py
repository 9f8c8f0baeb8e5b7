"""Tasks (prompts with a verifiable answer) and reward functions.

Built in: the synthetic ``echo`` task that a tiny random model learns on a CPU in minutes, and the GSM8K answer
check (``data.task=gsm8k``), the default reward for a data file. Files are read by ``data.py``, reward functions
of every style are called by ``rewards.py``.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from .data import FileTask, PromptFormatter, Sample, drop_long_prompts, load_samples, split_validation
from .rewards import Reward, parse_specs

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

BUILTIN_REWARDS = {"echo": "engine.grpo.tasks:echo_reward", "gsm8k": "engine.grpo.tasks:gsm8k_reward"}


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What a run reads, resolved once from its config (``data_spec``) and passed down: its prompt files, how a row
    becomes a prompt, and its reward functions. ``data.py`` and ``rewards.py`` take these as arguments and never see
    the config, so inputs load in one direction: config -> spec -> rewards -> prompts."""

    path: str | None = None
    val_path: str | None = None
    val_fraction: float = 0.0
    prompt_key: str | None = None
    answer_key: str | None = None
    chat_template: str = "auto"
    system_prompt: str | None = None
    max_prompt_tokens: int | None = None
    seed: int = 0  # of the data.val_fraction split
    rewards: tuple[tuple[str, float], ...] = ()  # (module:function, weight): data.reward, else the task's own
    reward_style: str = "auto"


def data_spec(config) -> DataSpec:
    """The one place a run's config enters data loading (a bad ``data.reward`` / ``data.reward_weights`` raises)."""
    d = config.data
    return DataSpec(path=d.path, val_path=d.val_path, val_fraction=d.val_fraction, prompt_key=d.prompt_key,
                    answer_key=d.answer_key, chat_template=d.chat_template, system_prompt=d.system_prompt,
                    max_prompt_tokens=d.max_prompt_tokens, seed=config.train.seed,
                    rewards=tuple(parse_specs(d.reward or BUILTIN_REWARDS[d.task], d.reward_weights)),
                    reward_style=d.reward_style)


def needs_answers(rewards: list[Reward]) -> bool:
    """Whether every row must have an answer column: only TRL-style rewards do without one."""
    return any(reward.style != "trl" for reward in rewards)


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
