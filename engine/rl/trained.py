"""Models an algorithm trains beside the policy (``Algorithm.trained_models``: PPO's critic). The step builds each
as an engine of its own (its optimizer and schedule) and lists it after the policy in ``engines``, so the frame's
loop checkpoints and resumes them all as one step (``engine/checkpoint/engine_set.py``: ``<name>/`` beside
``policy/``); the algorithm reaches them through ``StepContext.trained``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .. import FSDPEngine


@dataclasses.dataclass(frozen=True)
class TrainedSpec:
    """``engine``: its ``EngineConfig``; ``model``: called with the policy's source (a directory or a factory), the
    model's source (a directory or a zero-argument factory)."""

    engine: object
    model: Callable[[object], object]


def trained_models(specs: dict, policy_source, backend) -> dict[str, FSDPEngine]:
    """The engines an algorithm asked for, by name, built in that order."""
    return {name: FSDPEngine(spec.model(policy_source), spec.engine, backend) for name, spec in specs.items()}
