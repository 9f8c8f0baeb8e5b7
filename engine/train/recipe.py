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
class Evaluation:
    """What one rank's ``Recipe.evaluate`` hands back to the frame's ``eval`` command.

    ``metrics`` are the scores, already the same on every rank (reduced over ranks), written to ``results.json``;
    ``samples`` this rank's scored records (rank 0 writes every rank's to ``samples.jsonl``, sorted by ``index``
    when each has one; none: no file); ``results`` other fields of ``results.json`` (counts, the settings used).
    """

    metrics: dict[str, float]
    samples: list[dict] = dataclasses.field(default_factory=list)
    results: dict = dataclasses.field(default_factory=dict)


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
    # Options whose value is a path: resolved against the directory the command ran in, before any worker starts.
    path_keys: tuple[str, ...] = ("model.path", "data.path", "data.val_path")
    # ``--resume`` refuses to change these (a key, or a section and everything in it), with why, in one line.
    resume_fixed: dict[str, str] = {"trainer": "the trainer", "model": "the model the checkpoint holds",
                                    "engine.lora_rank": "the LoRA adapters the checkpoint holds",
                                    "engine.lora_alpha": "the LoRA adapters the checkpoint holds",
                                    "engine.lora_target_modules": "the LoRA adapters the checkpoint holds"}
    eval_help: str = ""  # what ``eval`` scores, one paragraph for ``<tool> eval --help``
    # eval of a run: its checkpoint exported as a model directory (LoRA merged, fp32) for ``evaluate``; False: the
    # checkpoint directory itself (the recipe loads it into an engine of the run's model, any world size)
    eval_exports: bool = True

    # -- the config pipeline (``cli.load`` and ``cli.main`` call these in order) ------------------------------

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
        checkpoints, ``parts.rank`` / ``parts.world_size`` this rank's place. A recipe training several engines (a
        policy and a critic) names them all in ``parts.engines`` (name -> FSDPEngine, the policy first): the loop
        saves them as one checkpoint, complete only once all are, resumes them all, and export writes the policy."""
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
        """Validation metrics after step ``index`` (``baseline``: before the first step; {} when the recipe has none
        then). The loop calls it only when validation is due (``engine.train.validation.should_validate``)."""
        return {}

    def done_line(self, rows: list[dict], seconds: float) -> str | None:
        """The line printed when a run finished, from its metrics rows."""
        return None

    def curves_for(self, config) -> tuple[tuple[str, str], ...]:
        """The (metric, title) panels of this run's curves.png: ``curves`` unless the titles follow the options."""
        return self.curves

    def derived_engine_options(self, config, derived: dict) -> dict:
        """``engine.*`` values this recipe derived from other options when they were not given (the seed, the
        schedule's length), as a run's record holds them (``derived``: its ``derived`` section): ``--resume``
        derives them again from the resumed config."""
        return {}

    def prompt_settings(self, config, derived: dict) -> dict:
        """How the run prompted its model, for ``export`` to write into the model directory
        (``engine/train/prompting.py``): any of ``system_prompt``, ``chat_template`` (auto / none),
        ``max_new_tokens``; ``derived`` is the record's ``derived`` section. {}: nothing to remember."""
        return {}

    def prompt_keys(self) -> dict[str, str]:
        """The options a model directory's remembered prompt settings fill (``{"max_new_tokens":
        "rollout.max_new_tokens"}``) when a run or eval starts from it and does not set them."""
        return {}

    # -- eval (the frame's ``eval`` command; offered when ``evaluate`` is implemented) ---------------------------

    def eval_problems(self, config, target: dict, world_size: int) -> list[str]:
        """What would stop an evaluation, one sentence each, before any worker starts (``target``: ``run``,
        ``checkpoint``, ``step`` for a run, ``model`` for a model directory); training-only checks do not apply."""
        return []

    def eval_inputs(self, config) -> dict:
        """Read the evaluation data in the launching process (bad rows fail here), sizing the config from it where
        needed; returns fields for ``results.json`` (e.g. ``{"prompts": 8}``)."""
        return {}

    def evaluate(self, config, weights: str | None, backend) -> Evaluation:
        """Score on this rank (the process group exists). ``weights``, for a run: a model directory with its
        checkpoint exported by the frame (LoRA merged, fp32), or with ``eval_exports = False`` the checkpoint
        directory; None: ``config.model.path`` as it is."""
        raise NotImplementedError
