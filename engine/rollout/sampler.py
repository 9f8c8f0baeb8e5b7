"""The one way a trainer samples: ``sampler(engine, samples, sampling) -> RolloutBatch``, single-turn or
multi-turn (tools, an environment) chosen once when the run is built, so the step never asks which it has."""

from __future__ import annotations

from typing import Callable, Protocol

from .engines import RolloutEngine, SamplingConfig
from .multi_turn import build as build_multi_turn
from .single_turn import RolloutBatch, SingleTurnRollout


class Sampler(Protocol):
    def __call__(self, engine: RolloutEngine, samples: list, sampling: SamplingConfig) -> RolloutBatch:
        """``sampling.n`` responses per sample (consecutive rows form a group); samples have ``prompt`` (text),
        ``raw_prompt`` (chat messages or text) and their data row."""


def build_sampler(config, tokenizer, any_rank: Callable[[bool], bool] | None = None) -> Sampler:
    """``MultiTurnRollout`` when the run has ``rollout.tools`` or ``rollout.environment`` (``any_rank`` keeps every
    rank's engine calls in step), else ``SingleTurnRollout``."""
    return build_multi_turn(config, tokenizer, any_rank) or SingleTurnRollout(tokenizer)
