"""Reward functions in three styles, chosen by signature (or ``data.reward_style``), several with weights.

- ``simple``: ``reward(prompt, response, answer) -> float`` (this project's own).
- ``verl``: ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` returning a number or a
  dict with a ``score`` key.
- ``trl``: ``reward(prompts, completions, **columns) -> list[float]``, called once per batch; completions are text
  when the prompts are text and ``[{"role": "assistant", "content": ...}]`` when they are chat messages.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, Callable

from ..object_loader import load_object
from .prompt_types import Sample

STYLES = ("auto", "simple", "verl", "trl")
FLOAT32_MAX = 3.4028234663852886e38  # rewards are summed over ranks in float32: a larger one would be inf


@dataclasses.dataclass
class Reward:
    spec: str
    fn: Callable
    style: str
    weight: float = 1.0

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", self.spec)


def import_function(spec: str) -> Callable:
    """The reward function ``spec`` names (``data.reward``), through the one ``module:attribute`` loader."""
    return load_object(spec, what="function", key="data.reward", accept=callable)


def detect_style(fn: Callable, spec: str) -> str:
    """``simple``, ``verl`` or ``trl`` from the parameter names; anything else is an error that shows all three."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise ValueError(f"reward function {spec}: its signature cannot be read; set data.reward_style") from None
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_kwargs = any(p.kind == p.VAR_KEYWORD for p in parameters)
    if names[:3] == ["data_source", "solution_str", "ground_truth"]:
        return "verl"
    if names[:2] == ["prompts", "completions"] or (names[:1] == ["completions"] and has_kwargs):
        return "trl"
    required = [p for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                             p.POSITIONAL_OR_KEYWORD)]
    if len(names) >= 3 and len(required) <= 3 and "prompts" not in names:
        return "simple"
    raise ValueError(f"reward function {spec}{inspect.signature(fn)} fits no reward style: write "
                     "reward(prompt, response, answer), compute_score(data_source, solution_str, ground_truth, "
                     "extra_info=None) or reward(prompts, completions, **columns), or set data.reward_style")


def parse_specs(reward: str | list | None, weights: list | None) -> list[tuple[str, float]]:
    """``data.reward`` (one spec or a list) with ``data.reward_weights`` (default 1.0 each)."""
    specs = [reward] if isinstance(reward, str) else list(reward or [])
    if weights is None:
        weights = [1.0] * len(specs)
    if len(weights) != len(specs):
        raise ValueError(f"data.reward_weights has {len(weights)} entries for {len(specs)} reward function(s)")
    for spec, weight in zip(specs, weights, strict=True):
        if not isinstance(spec, str):
            raise ValueError(f"data.reward entries must be 'module:function' strings, got {spec!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"data.reward_weights entries must be numbers, got {weight!r}")
    return [(spec, float(weight)) for spec, weight in zip(specs, weights, strict=True)]


def load_rewards(specs: list[tuple[str, float]], style: str = "auto") -> list[Reward]:
    if style not in STYLES:
        raise ValueError(f"data.reward_style must be one of {', '.join(STYLES)}, got {style!r}")
    rewards = []
    for spec, weight in specs:
        fn = import_function(spec)
        rewards.append(Reward(spec, fn, detect_style(fn, spec) if style == "auto" else style, weight))
    return rewards


def _number(value: Any, reward: Reward, sample: Sample, response: str) -> float:
    if reward.style == "verl" and isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"reward function {reward.name} returned a dict without a 'score' key "
                             f"({sorted(value)}) for row {sample.where}")
        value = value["score"]
    number = real_number(value)
    if number is None:
        raise ValueError(f"reward function {reward.name} returned {value!r} ({type(value).__name__}) for "
                         f"{_where(sample)}: it must return a real number (int, float, bool, a numpy or torch "
                         "scalar), not text or a container") from None
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        raise ValueError(f"reward function {reward.name} returned {number} for {_where(sample)} and response "
                         f"{response!r}: rewards must be finite numbers within float32's range (about 3.4e38), "
                         "which is how they are summed over ranks")
    return number


def real_number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (bool, int, float, a numpy or torch scalar), else None: text
    such as ``"1.0"`` is not a reward."""
    import numbers

    if isinstance(value, numbers.Real):  # bool and int too; numpy's scalars register here
        return float(value)
    shape = getattr(value, "shape", None)
    dtype = str(getattr(value, "dtype", ""))
    if shape is not None and tuple(shape) == () and hasattr(value, "item") and not any(
            kind in dtype for kind in ("str", "complex", "object", "<U", "|S")):
        item = value.item()  # a 0-d numpy array or torch tensor
        return float(item) if isinstance(item, numbers.Real) else None
    return None


def _where(sample: Sample) -> str:
    """Which prompt, once: its row in the data file, or (built-in tasks) the prompt as given."""
    if sample.where:
        return f"row {sample.where}"
    shown = sample.raw_prompt if sample.raw_prompt is not None else sample.prompt
    return f"prompt {shown!r}"


def _completion(sample: Sample, response: str) -> Any:
    return response if isinstance(sample.raw_prompt, str) or sample.raw_prompt is None else [
        {"role": "assistant", "content": response}]


def _accepts(fn: Callable, name: str) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind == p.VAR_KEYWORD for p in parameters)


def _call(reward: Reward, samples: list[Sample], responses: list[str], completions: list | None = None,
          environments: list | None = None) -> list[Any]:
    if reward.style == "model":  # a reward model or judge (reward_model.py): the whole batch at once
        return reward.fn.score(samples, responses, completions)
    if reward.style == "trl":
        columns: dict[str, list] = {}
        for key in samples[0].row:
            if key != "prompt":
                columns[key] = [s.row.get(key) for s in samples]
        prompts = [s.raw_prompt if s.raw_prompt is not None else s.prompt for s in samples]
        if completions is None:
            completions = [_completion(s, r) for s, r in zip(samples, responses, strict=True)]
        if environments is not None and _accepts(reward.fn, "environments"):  # TRL's environment_factory style
            columns["environments"] = environments
        values = reward.fn(prompts=prompts, completions=completions, **columns)
        if not isinstance(values, (list, tuple)) or len(values) != len(samples):
            got = f"a {type(values).__name__} of {len(values)}" if isinstance(values, (list, tuple)) else \
                type(values).__name__
            raise ValueError(f"reward function {reward.name} (TRL style) must return a list of {len(samples)} "
                             f"numbers, one per completion, got {got} (for {len(samples)} completions)")
        return list(values)
    values = []
    for sample, response in zip(samples, responses, strict=True):
        try:
            if reward.style == "verl":
                values.append(reward.fn(sample.data_source, response, sample.answer, extra_info=sample.extra_info))
            else:
                values.append(reward.fn(sample.prompt, response, sample.answer))
        except Exception as exc:
            raise _failure(reward, exc, sample.where, sample) from exc
    return values


def _failure(reward: Reward, exc: Exception, rows: str, sample: Sample) -> RuntimeError:
    where = f"row {rows}, " if rows else ""
    return RuntimeError(f"reward function {reward.name} raised {type(exc).__name__}: {exc} ({where}prompt "
                        f"{sample.prompt[-200:]!r})")


def score_each(rewards: list[Reward], samples: list[Sample], responses: list[str], completions: list | None = None,
               environments: list | None = None) -> list[list[float]]:
    """Every reward function's own (unweighted) value for each (sample, response), one list per function; a reward
    that raises is named with its row. A multi-turn rollout passes each trajectory's messages (``completions``,
    what TRL-style rewards get) and environment instances."""
    scores = []
    for reward in rewards:
        if reward.style in ("trl", "model"):
            try:
                values = _call(reward, samples, responses, completions, environments)
            except ValueError:
                raise
            except Exception as exc:
                raise _failure(reward, exc, f"{samples[0].where} and {len(samples) - 1} more in the batch"
                               if samples[0].where else "", samples[0]) from exc
        else:
            values = _call(reward, samples, responses)
        scores.append([_number(value, reward, samples[index], responses[index])
                       for index, value in enumerate(values)])
    return scores


def weighted_sum(rewards: list[Reward], scores: list[list[float]]) -> list[float]:
    """The reward of each response: the weighted sum of ``score_each``'s values."""
    return [sum(reward.weight * values[index] for reward, values in zip(rewards, scores, strict=True))
            for index in range(len(scores[0]) if scores else 0)]


def score_all(rewards: list[Reward], samples: list[Sample], responses: list[str], completions: list | None = None,
              environments: list | None = None) -> list[float]:
    """The weighted sum of every reward for each (sample, response); a reward that raises is named with its row."""
    if not rewards:
        return [0.0] * len(samples)
    return weighted_sum(rewards, score_each(rewards, samples, responses, completions, environments))


def metric_names(rewards: list[Reward]) -> list[str]:
    """``reward/<function name>`` for each reward function; its full spec where two share a name."""
    names = [reward.name for reward in rewards]
    return [f"reward/{reward.name if names.count(reward.name) == 1 else reward.spec}" for reward in rewards]


def get_reward(prompts, completions, environments=None, **columns):
    """The environment's own reward: ``get_reward()`` of each trajectory's environment instance."""
    return [float(environment.get_reward()) for environment in environments]


def environment_rewards(environment_spec: str | None) -> list[Reward]:
    """``[Reward]`` for a ``rollout.environment`` with ``get_reward()``, added to the run's reward functions."""
    if not environment_spec:
        return []
    from ..rollout.multi_turn.tools import load_environment

    environment = load_environment(environment_spec)
    if not callable(getattr(environment, "get_reward", None)):
        return []
    return [Reward(f"{environment_spec}.get_reward", get_reward, "trl", 1.0)]  # metric reward/get_reward
