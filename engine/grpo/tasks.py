"""Tasks (prompts with a verifiable answer) and reward functions.

A reward function is any callable ``reward(prompt: str, response: str, answer: str) -> float``, named on the
command line as ``module:function``. Built in: the synthetic ``echo`` task that a tiny random model learns on a CPU
in minutes, and GSM8K-style math from a JSONL file of ``question``/``answer`` rows.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import re
from pathlib import Path
from typing import Callable

import torch

RewardFn = Callable[[str, str, str], float]


@dataclasses.dataclass(frozen=True)
class Sample:
    prompt: str
    answer: str  # what the reward function checks the response against


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

    def sample(self, count: int, generator: torch.Generator) -> list[Sample]:
        letters = torch.randint(0, len(self.letters), (count,), generator=generator).tolist()
        repeats = torch.randint(1, self.max_repeat + 1, (count,), generator=generator).tolist()
        return [Sample(prompt=f"{self.letters[i]} x{n}:", answer=self.letters[i] * n)
                for i, n in zip(letters, repeats)]


def echo_reward(prompt: str, response: str, answer: str) -> float:
    """Share of the answer's positions the response gets right; extra characters cost as much as wrong ones."""
    hits = sum(1 for got, want in zip(response, answer) if got == want)
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


class JsonlMathTask:
    """GSM8K-style rows ``{"question": ..., "answer": "... #### 42"}``; prompts drawn with replacement."""

    name = "gsm8k"
    template = "Question: {question}\nAnswer: Let's think step by step."

    def __init__(self, path: str) -> None:
        self.rows = load_jsonl(path, required=("question", "answer"))

    def sample(self, count: int, generator: torch.Generator) -> list[Sample]:
        picks = torch.randint(0, len(self.rows), (count,), generator=generator).tolist()
        return [Sample(self.template.format(question=self.rows[i]["question"]), self.rows[i]["answer"])
                for i in picks]


def load_jsonl(path: str, required: tuple[str, ...]) -> list[dict]:
    """Read a JSONL file; a bad row fails with the file, the line number and what is wrong."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"data file {file} does not exist: set data.path to a local JSONL file")
    rows = []
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{file}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{file}:{number}: expected a JSON object, got {type(row).__name__}")
            missing = [key for key in required if not isinstance(row.get(key), str) or not row[key].strip()]
            if missing:
                raise ValueError(f"{file}:{number}: missing or empty field(s) {', '.join(missing)} "
                                 f"(each row needs {', '.join(required)})")
            rows.append(row)
    if not rows:
        raise ValueError(f"data file {file} has no rows")
    return rows


# -- wiring -------------------------------------------------------------------------------------------------------

BUILTIN_REWARDS = {"echo": "engine.grpo.tasks:echo_reward", "gsm8k": "engine.grpo.tasks:gsm8k_reward"}


def build_task(name: str, data_path: str | None):
    if name == "echo":
        return EchoTask()
    if name == "gsm8k":
        if not data_path:
            raise ValueError("task gsm8k needs data.path: a JSONL file with question and answer fields")
        return JsonlMathTask(data_path)
    raise ValueError(f"unknown task {name!r}: use echo or gsm8k")


def load_reward_fn(spec: str) -> RewardFn:
    """Import ``module:function``; every failure says which part of the spec is wrong."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"reward function {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the user's module may fail in any way
        raise ValueError(f"cannot import reward module {module_name!r} ({type(exc).__name__}: {exc}); is it on "
                         "PYTHONPATH?") from None
    fn = getattr(module, attribute, None)
    if not callable(fn):
        raise ValueError(f"reward module {module_name!r} has no function {attribute!r}")
    return fn


def score(reward_fn: RewardFn, sample: Sample, response: str) -> float:
    value = reward_fn(sample.prompt, response, sample.answer)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"reward function {getattr(reward_fn, '__name__', reward_fn)} returned {value!r} for "
                         f"prompt {sample.prompt!r}: it must return a number") from None
    if not math.isfinite(value):
        raise ValueError(f"reward function {getattr(reward_fn, '__name__', reward_fn)} returned {value} for "
                         f"prompt {sample.prompt!r} and response {response!r}: rewards must be finite")
    return value
