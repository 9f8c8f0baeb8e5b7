"""``accel-rm``'s recipe: a Bradley-Terry reward model on the frame (``engine/train``). What is the reward model's own
lives here and in this package: the ``rm.*`` options and presets (``config.py``), the model and how it scores a
sequence (``model.py``), the loss and metrics (``loss.py``), the step and validation (``trainer.py``); pairs,
batches and the step's frame are shared with DPO (``engine.rl.offline``)."""

from __future__ import annotations

import dataclasses

from ...rl.offline import pair_eval
from ...rl.offline.pair_config import PAIR_RESUME_FIXED, plan_pairs
from ...rl.offline.run_config import resolved
from ...train import export as export_module
from ...train.recipe import Recipe
from . import trainer
from .config import PRESETS, RewardModelConfig, check

HELP = """Train a reward model (Bradley-Terry: a sequence-classification head on a causal language model, read at
the last token) on preference pairs: prompt/chosen/rejected as text or conversations, or chosen/rejected sharing
their prompt; rm.margin_key names a column of per-pair margins.

With no arguments: the CPU demo (2 processes; a tiny model learns synthetic preferences in about two
minutes). Given a model or data of your own, the library defaults apply (TRL's lr 1e-4) unless you name a preset
with --preset. The export loads with AutoModelForSequenceClassification.

examples:
  accel-rm                                        # the CPU demo
  accel-rm model.path=/models/Qwen2.5-0.5B-Instruct data.path=/data/pairs.jsonl
  accel-rm --preset h100 model.path=/models/Qwen2.5-0.5B-Instruct data.path=/data/pairs.jsonl
  accel-rm --resume run.name=rm-cpu-demo-20261201-101500
  accel-rm export runs/NAME /models/NAME-rm       # a checkpoint as a sequence-classification model directory
  accel-rm eval runs/NAME data.val_path=val.jsonl

Ctrl-C or SIGTERM finishes the current step, saves it and stops; the last line says how to resume.
Options, data formats and metrics: docs/preference.md.
"""


def plan(tool, config, world_size, verbose):
    """The pairs (each sequence with the extra token its score is read before) and the tokenizer's pad id."""
    from ...rl.offline.model_files import load_tokenizer
    from .model import scoring_pair

    planned = plan_pairs(tool, config, world_size, verbose=verbose, margin_key=config.rm.margin_key)
    data, batches = planned.inputs
    data = dataclasses.replace(data, train=[scoring_pair(p) for p in data.train],
                               val=[scoring_pair(p) for p in data.val])
    planned.derived["pad_token_id"] = load_tokenizer(config.model.path).pad_token_id
    planned.inputs = (data, batches)
    return planned


class RewardModelRecipe(Recipe):
    name, tool, help = "rm", "accel-rm", HELP
    schema, presets, curves = RewardModelConfig, PRESETS, trainer.CURVES
    sections, example = "model, data, train, rm, run, engine", "rm.center_rewards_coef=0.01"

    resume_fixed = {**PAIR_RESUME_FIXED, "rm.margin_key": "the run's data"}
    eval_help = pair_eval.HELP.format(tool="accel-rm", metrics="val/accuracy, val/rewards/*")

    def check(self, config, world_size):
        return check(config, world_size)

    def plan(self, config, world_size, *, verbose):
        return plan(self.tool, config, world_size, verbose)

    def resolved(self, plan):
        return resolved(plan.config, plan.derived)

    def build(self, plan, backend):
        return trainer.build(plan, backend)

    def step(self, parts, index):
        return trainer.rm_step(parts, index)

    def validate(self, parts, index, *, baseline=False):
        return trainer.validate(parts, index, baseline)

    def derived_engine_options(self, config, derived):
        return {"seed": config.train.seed, "total_steps": derived.get("total_steps")}

    def eval_problems(self, config, target, world_size):
        return pair_eval.problems(config, target) + check(config, world_size)

    def eval_inputs(self, config):
        return pair_eval.inputs(config, config.rm.margin_key)

    def evaluate(self, config, weights, backend):
        return trainer.evaluate(config, weights, backend)

    def run_model(self, config) -> export_module.RunModel:
        from ...rl.offline.model_files import load_tokenizer
        from ...rl.offline.run_config import engine_config
        from .model import factory

        path = config.model.path

        def build():
            tokenizer = load_tokenizer(path)
            return tokenizer, factory(path, config.train.seed, tokenizer.pad_token_id, weights=False)

        return export_module.RunModel(model_path=path, engine=engine_config(config, 1), build=build,
                                      loader="AutoModelForSequenceClassification")

    def done_line(self, rows, seconds):
        rows = [row for row in rows if "loss" in row]
        if not rows:
            return None
        final = rows[-5:]
        line = (f"{self.tool}: done in {seconds:.0f} s; loss {rows[0]['loss']:.3f} at the first step, "
                f"{sum(r['loss'] for r in final) / len(final):.3f} over the last {len(final)}, accuracy "
                f"{sum(r['accuracy'] for r in final) / len(final):.3f}")
        vals = [row for row in rows if "val/loss" in row]
        if vals:
            line += f"; validation loss {vals[-1]['val/loss']:.3f}, accuracy {vals[-1]['val/accuracy']:.3f}"
        return line
