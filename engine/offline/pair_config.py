"""What DPO's and a reward model's configs share: the ``train.*`` section of a run over preference pairs, the checks
of the shared sections and the plan (the pairs read and the global batches fixed before any worker starts)."""

from __future__ import annotations

import dataclasses
import sys

from accel_backends.names import not_one_of

from ..train.recipe import Plan, Recipe
from ..train.settings import RunConfig, TrainerConfig
from .pair_data import TRUNCATIONS, PairDataConfig
from .run_config import input_problems, size_problems, sizing_problems


@dataclasses.dataclass
class PairTrainConfig:
    epochs: float = 1.0
    steps: int | None = None  # optimizer steps; null: as many as train.epochs passes over the pairs make
    batch_size: int = 32  # pairs per optimizer step over ALL ranks (whatever the world size)
    batch_tokens: int | None = None  # or: pairs per step until their tokens reach this (replaces batch_size)
    micro_batch_tokens: int | None = None  # tokens per micro-batch per rank; a pair's two sequences count together
    micro_batch_size: int = 8  # pairs per micro-batch per rank, when micro_batch_tokens is not set
    padding_free: bool = True  # pack each micro-batch in one row where the model keeps sequences apart
    seed: int = 0  # shuffling (each epoch its own order), the demo task, a new head's weights, the engine's seed


@dataclasses.dataclass
class PairConfig(TrainerConfig):
    """The sections every trainer on preference pairs shares (its own, ``run``, ``engine`` and ``trainer`` follow)."""

    data: PairDataConfig = dataclasses.field(default_factory=PairDataConfig)
    train: PairTrainConfig = dataclasses.field(default_factory=PairTrainConfig)


def pair_config(name: str, trainer: str, settings: type, module: str) -> type:
    """A pair trainer's config root ``name``: the shared sections, then its own ``<trainer>`` section (``settings``),
    ``run``, ``engine`` and ``trainer`` (recorded in config.json: export and eval know which schema reads it)."""
    fields = [(trainer, settings.__name__, dataclasses.field(default_factory=settings)),
              ("run", "RunConfig", dataclasses.field(default_factory=RunConfig)),
              ("engine", "dict[str, Any]", dataclasses.field(default_factory=dict)),
              ("trainer", "str", dataclasses.field(default=trainer))]
    return dataclasses.make_dataclass(name, fields, bases=(PairConfig,), namespace={"__module__": module})


# What ``--resume`` may not change in a run over pairs (beside the frame's model and adapters), with why.
PAIR_RESUME_FIXED = {**Recipe.resume_fixed, "train.batch_size": "the run's batches",
                     "train.batch_tokens": "the run's batches", "train.seed": "the run's batches",
                     **{f"data.{key}": "the run's data" for key in (
                         "path", "prompt_key", "chosen_key", "rejected_key", "tools_key", "max_length", "truncation",
                         "val_fraction", "demo_pairs")}}


def pair_problems(config, world_size: int, extra_tokens: int = 0) -> list[str]:
    """The problems of the shared sections (``model``, ``data``, ``train``, ``run``, ``engine``) found from the
    options alone, one sentence each (the data is checked next, in ``plan_pairs``). ``extra_tokens``: what the
    trainer adds to each sequence of ``data.max_length`` tokens."""
    d = config.data
    problems = input_problems(config)
    if d.truncation not in TRUNCATIONS:
        problems.append(not_one_of("data.truncation", d.truncation, TRUNCATIONS))
    problems += size_problems(config, "demo_pairs")
    if problems:
        return problems
    tokens = 2 * (d.max_length + extra_tokens)
    return sizing_problems(config, world_size, unit_tokens=tokens, items="pairs",
                           limit=f"{tokens} tokens, two sequences of data.max_length={d.max_length}",
                           unit="a pair (its two sequences run in one micro-batch)")


def plan_pairs(tool: str, config, world_size: int, *, verbose: bool, margin_key: str | None = None) -> Plan:
    """Read and tokenize the pairs (bad rows fail here, in one line) and fix the run's global batches."""
    from ..train.loggers import require_loggers
    from .epochs import schedule
    from .model_files import load_tokenizer, resolve_model_path
    from .pair_data import build_pairs

    require_loggers(config.run.loggers)
    resolve_model_path(config)  # the demo model's directory: config.json records the real path
    data = build_pairs(config.data, load_tokenizer(config.model.path), config.train.seed, margin_key)
    t = config.train
    batches = schedule([pair.tokens for pair in data.train], batch_size=t.batch_size, batch_tokens=t.batch_tokens,
                       epochs=t.epochs, steps=t.steps, seed=t.seed)
    if verbose:
        print(f"{tool}: data: {data.summary()}", file=sys.stderr)
    derived = {"world_size": world_size, "total_steps": len(batches), "conversational": data.conversational,
               "implicit_prompt": data.implicit_prompt, "train_pairs": len(data.train), "val_pairs": len(data.val)}
    return Plan(config, world_size, len(batches), derived, inputs=(data, batches))
