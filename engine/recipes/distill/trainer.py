"""On-policy distillation's trainer: the RL step (``engine/rl/step.py``) driven by the distillation algorithm
(``algorithm.py``), with the teacher's forward timed as ``distill/teacher_s`` (the rank that took longest)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...rl.step import RLTrainer
from ...runtime import phase_timings
from .algorithm import TEACHER, DistillAlgorithm


class DistillTrainer(RLTrainer):
    """A distillation run's parts on one rank: the student (``actor``), the teacher, the rollout engine, data."""

    recipe, tool = "distill", "accel-distill"

    def __init__(self, config, run_dir: Path | None = None, resume: bool = False, inputs=None) -> None:
        super().__init__(config, DistillAlgorithm(config), run_dir, resume, inputs)

    @property
    def teacher(self):
        """The frozen teacher (``rl.frozen.FrozenModel``, or ``rl.server_logprobs.ServerFrozenModel``)."""
        return self.frozen[TEACHER]

    def step(self, step: int):
        with phase_timings(self.backend.synchronize) as timer:
            result = super().step(step)
        teacher_s = timer.seconds.get(f"{TEACHER}_log_probs", 0.0)
        row_of = result.metrics

        def metrics(totals: dict, largest: dict) -> dict:
            return {**row_of(totals, largest), "distill/teacher_s": largest["distill_teacher_s"]}

        return dataclasses.replace(result, metrics=metrics, maxima={**result.maxima, "distill_teacher_s": teacher_s})
