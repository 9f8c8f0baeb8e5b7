"""``accel-rm``'s recipe: a Bradley-Terry reward model on the frame (``engine/train``). What is the reward model's own
lives here and in this package: the ``rm.*`` options and presets (``config.py``), the model and how it scores a
sequence (``model.py``), the loss and metrics (``loss.py``), the step and validation (``trainer.py``); pairs,
batches and the step's frame are shared with DPO (``engine.offline``)."""

from __future__ import annotations

import dataclasses

from ....train import export as export_module
from ... import pair_eval
from ...pair_config import plan_pairs
from ...pair_recipe import PairRecipe
from ...run_config import command_help
from . import trainer
from .config import PRESETS, RewardModelConfig, check

HELP = """Train a reward model (Bradley-Terry: a sequence-classification head on a causal language model, read at
the last token) on preference pairs: prompt/chosen/rejected as text or conversations, or chosen/rejected sharing
their prompt; rm.margin_key names a column of per-pair margins.

With no arguments: the CPU demo (2 processes; a tiny model learns synthetic preferences in about two
minutes). Given a model or data of your own, the library defaults apply (TRL's lr 1e-4) unless you name a preset
with --preset. The export loads with AutoModelForSequenceClassification.

""" + command_help("accel-rm", "model.path=/models/Qwen2.5-0.5B-Instruct data.path=/data/pairs.jsonl",
                         export_to="/models/NAME-rm",
                         export_what="a checkpoint as a sequence-classification model directory",
                         doc="docs/preference.md")


def plan(tool, config, world_size, verbose):
    """The pairs (each sequence with the extra token its score is read before) and the tokenizer's pad id."""
    from ...model_files import load_tokenizer
    from .model import scoring_pair

    planned = plan_pairs(tool, config, world_size, verbose=verbose, margin_key=config.rm.margin_key)
    data, batches = planned.inputs
    data = dataclasses.replace(data, train=[scoring_pair(p) for p in data.train],
                               val=[scoring_pair(p) for p in data.val])
    planned.derived["pad_token_id"] = load_tokenizer(config.model.path).pad_token_id
    planned.inputs = (data, batches)
    return planned


class RewardModelRecipe(PairRecipe):
    name, tool, help = "rm", "accel-rm", HELP
    schema, presets, curves, trainer = RewardModelConfig, PRESETS, trainer.CURVES, trainer
    sections, example = "model, data, train, rm, run, engine", "rm.center_rewards_coef=0.01"
    resume_fixed = {**PairRecipe.resume_fixed, "rm.margin_key": "the run's data"}
    eval_help = pair_eval.HELP.format(tool="accel-rm", metrics="val/accuracy, val/rewards/*")

    def check_options(self, config, world_size):
        return check(config, world_size)

    def margin_key(self, config):
        return config.rm.margin_key

    def plan(self, config, world_size, *, verbose):
        return plan(self.tool, config, world_size, verbose)

    def run_model(self, config) -> export_module.RunModel:
        from ...model_files import load_tokenizer
        from ...run_config import engine_config
        from .model import factory

        path = config.model.path

        def build():
            tokenizer = load_tokenizer(path)
            return tokenizer, factory(path, config.train.seed, tokenizer.pad_token_id, weights=False)

        return export_module.RunModel(model_path=path, engine=engine_config(config, 1), build=build,
                                      loader="AutoModelForSequenceClassification")
