"""GRPO's trainer: the RL step (``engine/rl/step.py``) driven by GRPO's algorithm (``algorithm.py``: its advantage
choice, DAPO's dynamic sampling and the loss type's terms). Every rank runs it inside the frame's loop
(``engine/train/loop.py``); data files, reward styles, sampling, rollout engines, log-probs, validation and loggers
live in the RL layer and the rollout layer (see ``docs/grpo.md``)."""

from __future__ import annotations

from pathlib import Path

from ...rl.parts import load_inputs  # noqa: F401  (the recipe's plan loads its inputs through this name)
from ...rl.step import RLTrainer
from .algorithm import GRPOAlgorithm
from .config import GRPOConfig
from .loss_types import LossSettings


class GRPOTrainer(RLTrainer):
    """A GRPO run's parts on one rank: the actor (and reference) engines, the rollout engine, data and rewards."""

    recipe, tool = "grpo", "accel-grpo"

    def __init__(self, config: GRPOConfig, run_dir: Path | None = None, resume: bool = False, inputs=None) -> None:
        super().__init__(config, GRPOAlgorithm(config), run_dir, resume, inputs)

    @property
    def loss(self) -> LossSettings:
        """``algorithm.loss_type``'s recipe with the keys set explicitly, as concrete settings (``loss_types.py``)."""
        return self.algorithm.settings
