"""What a trainer is to the frame: a ``Recipe``. The frame (this package) owns the loop, the config pipeline and the
commands; a recipe holds only what differs between trainers: its config schema and presets, its migrations and
checks, the sizes it derives, how it builds its parts and takes one step, its validation and its curves.

A recipe registers itself through the ``register_recipes`` hook (``hookspecs.py``); the frame never imports one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class StepResult:
    """What one step hands back to the loop (nothing is left on the recipe's parts for the loop to find).

    ``sums`` and ``maxima`` are this rank's figures; the loop adds the sums over ranks and takes the largest of the
    maxima, once per step, and passes both to ``metrics`` to make the step's metrics row (without ``step``). A
    recipe whose figures are already the same on every rank leaves both empty and returns them from ``metrics``.
    """

    metrics: Callable[[dict[str, float], dict[str, float]], dict[str, float]]
    sums: dict[str, float] = dataclasses.field(default_factory=dict)
    maxima: dict[str, float] = dataclasses.field(default_factory=dict)
    samples: list[dict] = dataclasses.field(default_factory=list)  # rank 0's records for samples.jsonl
    shown: Callable[[dict], dict[str, str]] = lambda row: {}  # the progress bar's figures, from the metrics row


@dataclasses.dataclass
class Plan:
    """A run's sizes, derived once from the config and the world size (and, for some recipes, the data)."""

    config: Any  # the recipe's config root
    world_size: int
    total_steps: int
    derived: dict  # recorded under ``derived`` in config.json and --print-config
    inputs: Any = None  # what the recipe read while planning (its data), handed on to ``build``


class Recipe:
    """The base of every trainer. Subclasses set the class attributes and implement the methods that raise."""

    name: str = ""  # "grpo": the registry's key, the run record's ``trainer`` and the run directories' prefix
    tool: str = ""  # "accel-grpo": the command's name in messages
    help: str = ""  # the command's --help text, written for users
    schema: type = object  # the config root: a dataclass deriving from ``engine.train.TrainerConfig`` (or ConfigRoot)
    presets: dict[str, dict] = {}
    curves: tuple[tuple[str, str], ...] = ()  # (metric, title) panels of curves.png
    sections: str = "model, data, train, run, engine"  # the YAML file's sections, for --help
    example: str = "train.steps=10"  # a pair of overrides, for --help
    commands: dict[str, Callable[[list[str]], int]] = {}  # sub-commands of the recipe's own (export/eval: frame's)

    # -- the config pipeline (``pipeline.py`` calls these in order) --------------------------------------------

    def migrate(self, config) -> list[str]:
        """Move deprecated keys to their new names and fill keys other keys decide; notices for the user."""
        return []

    def check(self, config, world_size: int) -> list[str]:
        """Every problem found from the options alone, one sentence each."""
        return []

    def plan(self, config, world_size: int, *, verbose: bool) -> Plan:
        """Read and check the inputs (data, rewards, tokenizer) so bad input fails before any worker starts, and
        derive the run's sizes once."""
        raise NotImplementedError

    def resolved(self, plan: Plan) -> dict:
        """The config as the run uses it (every engine default) with ``derived``: config.json's content."""
        raise NotImplementedError

    # -- the run (every rank) ----------------------------------------------------------------------------------

    def build(self, plan: Plan, backend) -> Any:
        """The run's parts on this rank (engines, data, ...); ``parts.engine`` is the FSDPEngine the loop
        checkpoints, ``parts.rank`` / ``parts.world_size`` this rank's place."""
        raise NotImplementedError

    def ready(self, parts, start: int) -> None:
        """Called once the loop has loaded the checkpoint it resumes from (``start``: the steps already done), before
        the first step: e.g. push the weights to a rollout engine holding its own copy."""

    def close(self, parts) -> None:
        """Called once when the loop ends, whatever ended it (the last step, a stop at a safe point, an error):
        e.g. stop a thread the recipe started in ``ready``."""

    def step(self, parts, index: int) -> StepResult:
        """Step ``index`` (0-based)."""
        raise NotImplementedError

    def validate(self, parts, index: int, *, baseline: bool = False) -> dict:
        """Validation metrics after step ``index`` when due (``baseline``: before the first step); {} when not."""
        return {}

    def done_line(self, rows: list[dict], seconds: float) -> str | None:
        """The line printed when a run finished, from its metrics rows."""
        return None
