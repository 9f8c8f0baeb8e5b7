"""``OfflineRecipe``: what every recipe on a fixed data set (SFT, DPO, reward models) hands the frame the same way:
the one supervised step and its validation (``step.py``), the run's record, the engine options that follow from the
data, and the model an export writes. A subclass names its objective's module (``trainer``: ``build(plan,
backend)``) and plans its data."""

from __future__ import annotations

from ..train import export as export_module
from ..train.recipe import Recipe
from . import step as supervised
from .run_config import resolved


class OfflineRecipe(Recipe):
    trainer = None  # the objective's module: build(plan, backend) -> step.Parts, evaluate(config, weights, backend)

    def build(self, plan, backend):
        return self.trainer.build(plan, backend)

    def step(self, parts, index):
        return supervised.train_step(parts, index)

    def validate(self, parts, index, *, baseline=False):
        return supervised.validate(parts, index, baseline)

    def evaluate(self, config, weights, backend):
        return self.trainer.evaluate(config, weights, backend)

    def resolved(self, plan):
        return resolved(plan.config, plan.derived)

    def derived_engine_options(self, config, derived):
        return {"seed": config.train.seed, "total_steps": derived.get("total_steps")}

    def run_model(self, config) -> export_module.RunModel:
        """A causal LM directory (the tokenizer and ``model.path``); the reward model has its own."""
        from .model_files import load_tokenizer
        from .run_config import engine_config

        path = config.model.path
        return export_module.RunModel(model_path=path, engine=engine_config(config, 1),
                                      build=lambda: (load_tokenizer(path), path))
