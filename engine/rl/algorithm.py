"""What an RL algorithm writes: its ``Algorithm``, a small class the RL step (``step.py``) asks at fixed points. The
step itself is blind to the algorithm: it samples, scores, gathers the step's batch, computes the log-probs the
algorithm asked for and runs the updates; the algorithm says which frozen models it needs and which other models it
trains beside the policy (PPO's critic), turns scores into advantages (per sequence, and per token once the frozen
models' log-probs are in, seeing the trained models), lists the loss's terms (``terms.py``) and updates its own
models after the policy's update. ``docs/adding-a-trainer.md`` walks through writing one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from .registration import Registered
from .scoring import ScoredRollout


@dataclasses.dataclass
class Drawn:
    """One rank's sampled and scored responses for a step: what it trains on (``scored``), every draw made (for
    the rollout metrics), the algorithm's own sampling figures (summed over ranks) and ``trains`` (False: the
    rows are a placeholder, left out of the step)."""

    scored: ScoredRollout
    draws: list[ScoredRollout]
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    trains: bool = True


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What the algorithm's hooks may use of the step beyond their arguments."""

    groups: object  # groups.SamplingGroups: this rank's data-parallel group (counts, leader, sums once per group)
    total: Callable[[dict], dict]  # sums named numbers over all ranks (a collective: every rank calls it)
    reward_weights: tuple[float, ...]  # one per reward function, in the order of ScoredRollout.by_function
    pad_token_id: int
    # The engines the algorithm trains beside the policy (``Algorithm.trained_models``), by name, built by the step.
    trained: dict = dataclasses.field(default_factory=dict)
    device: object = None  # where a micro-batch goes for a forward (the backend's device)


class Algorithm(Registered):
    """The defaults: one draw per step, the scores as they are for advantages, no frozen model, no loss term (an
    algorithm gives at least one). Hooks run on every rank; a hook that calls a collective is called on all. Built
    from the run's config (``Algorithm(config)``); the class attributes ``Registered`` lists make its command."""

    needs_old_log_probs = False  # the sampling policy's log-probs before the update (even with one update a step)
    mask_truncated = False  # responses cut at rollout.max_new_tokens get no loss
    overlong = (0, 1.0)  # DAPO's overlong penalty: (buffer length, factor); 0: off
    metric_aliases: dict[str, str] = {}  # a step figure also reported under a name the algorithm gave it before

    def __init__(self, config) -> None:
        self.config = config  # the run's config (``schema``)

    def frozen_models(self, world_size: int) -> dict:
        """``{name: frozen.FrozenSpec}``: the frozen models whose log-probs of the step's tokens it uses."""
        return {}

    def trained_models(self, world_size: int) -> dict:
        """``{name: trained.TrainedSpec}``: models the step builds and the algorithm trains beside the policy (PPO's
        critic), in ``StepContext.trained``; the frame checkpoints and resumes them with the policy, as ``name/``."""
        return {}

    def draw(self, draw: Callable[[], ScoredRollout], context: StepContext, prompts_per_step: int) -> Drawn:
        """This rank's responses for the step, ``draw()`` sampling and scoring one batch of its prompts."""
        scored = draw()
        return Drawn(scored, [scored])

    def advantages(self, scored: ScoredRollout, context: StepContext, leads: bool) -> torch.Tensor:
        """``[B]`` per sequence, on the rank that sampled them (its groups are whole); ``leads``: this rank's rows
        count for its group (its figures go into sums over ranks). A per-token estimator returns what its
        ``token_advantages`` starts from."""
        return scored.rewards

    def token_advantages(self, data, context: StepContext) -> torch.Tensor | None:
        """``[N, R]`` per token for this rank's share of the step's batch (``data``: the ``StepData``, with the
        frozen models' and, when asked for, the old log-probs), or None to keep the per-sequence ones."""
        return None

    def terms(self) -> list:
        """The loss's terms (``terms.Term``), asked for once per run, when the step is built."""
        raise NotImplementedError

    def updates_policy(self, step: int) -> bool:
        """Whether step ``step`` (0-based) updates the policy (False: a warm-up of the algorithm's own models)."""
        return True

    def after_update(self, data, step: int, context: StepContext) -> dict:
        """After the policy's update of step ``step`` (``data``: the ``StepData`` the update ran on): the algorithm's
        own models' updates; their figures (names with a ``/``) join the step's row."""
        return {}

    def metrics(self, totals: dict[str, float], groups: int) -> dict[str, float]:
        """The algorithm's own figures of the step's row, from ``Drawn.metrics`` summed over ranks."""
        return {}

    def notices(self, world_size: int) -> list[str]:
        """Sentences for the user once a run starts (deprecated settings and their replacements)."""
        return []
