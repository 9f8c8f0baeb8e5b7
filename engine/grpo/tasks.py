"""Tasks (prompts with a verifiable answer) and reward functions.

Built in: the synthetic ``echo`` task that a tiny random model learns on a CPU in minutes, and the GSM8K answer
check (``data.task=gsm8k``), the default reward for a data file. Files are read by ``data.py``, reward functions
of every style are called by ``rewards.py``.
"""

from __future__ import annotations

import re

import torch

from .data import FileTask, PromptFormatter, Sample, drop_long_prompts, load_samples, split_validation
from .rewards import load_rewards, parse_specs

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


def build_tasks(data, tokenizer, seed: int, verbose: bool = True):
    """(training task, validation samples or None) for ``DataConfig``: the echo task, or a data file's prompts."""
    if not data.path:
        return EchoTask(), None
    formatter = PromptFormatter(tokenizer, data.chat_template, data.system_prompt)
    if data.chat_template == "auto" and not formatter.use_template and verbose:
        print("accel-grpo: the tokenizer has no chat template: prompts are used as plain text", flush=True)
    need_answer = any(style != "trl" for style in reward_styles(data))

    def load(path):
        samples = load_samples(path, formatter, data.prompt_key, data.answer_key, need_answer)
        return drop_long_prompts(samples, tokenizer, data.max_prompt_tokens, path, verbose)

    train = load(data.path)
    validation = load(data.val_path) if data.val_path else None
    if validation is None and data.val_fraction:
        train, validation = split_validation(train, data.val_fraction, seed)
    return FileTask(train), validation


def reward_specs(data) -> list[tuple[str, float]]:
    return parse_specs(data.reward or BUILTIN_REWARDS[data.task], data.reward_weights)


def reward_styles(data) -> list[str]:
    return [reward.style for reward in load_rewards(reward_specs(data), data.reward_style)]
