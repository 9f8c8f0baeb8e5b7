"""``RLRecipe``: the frame's ``Recipe`` (``engine/train/recipe.py``) for every RL algorithm: one recipe, bound to
a registered algorithm by name (``RLRecipe(name, algorithm_class)``; ``accel-grpo``, ``accel-ppo`` and
``accel-distill`` are it bound to ``grpo``, ``ppo`` and ``distill``). The command's name and help, the schema and
presets, the checks, the curves, the path keys and what ``--resume`` may not change come from the algorithm's class
(``registration.py``); planning, building the step (``RLTrainer`` with the algorithm), validation, ``eval``, the
run's model for ``export``, the prompt settings an export remembers and the closing line are here."""

from __future__ import annotations

import importlib

from ..train import export as export_module
from ..train.recipe import Plan, Recipe
from .engine_settings import engine_config, resolved
from .model import BUILTIN_MODEL, build_model
from .sizes import derived

# An RL run's learning curves (curves.png), where its metrics have them.
CURVES = (("reward_mean", "reward (mean)"), ("val/accuracy", "validation accuracy"),
          ("val/reward_mean", "validation reward (mean)"), ("loss", "loss (policy + KL)"), ("kl", "KL to reference"),
          ("entropy", "token entropy"), ("grad_norm", "grad norm"), ("response_length", "response length"),
          ("step_time_s", "step time (s)"))


class RLRecipe(Recipe):
    sections, example = "model, data, rollout, algorithm, train, run, engine", "train.steps=10 rollout.n=4"
    curves = CURVES
    # The Algorithm class, or "package.module:Class" naming it (a subclass of this recipe may set it).
    algorithm: object = ""
    # --resume may not change what the run means (the frame adds the model, LoRA and the trainer).
    resume_fixed = {**Recipe.resume_fixed, "rollout.n": "the group size",
                    **{f"data.{key}": "the run's data" for key in (
                        "task", "path", "val_fraction", "prompt_key", "answer_key", "reward", "reward_weights",
                        "reward_style", "chat_template", "system_prompt")}}

    def __init__(self, name: str | None = None, algorithm: type | None = None) -> None:
        """Bound to ``algorithm`` (an ``Algorithm`` subclass) registered as ``name``: its class gives the rest."""
        if algorithm is None:
            return
        self.name, self.algorithm = name, algorithm
        self.tool = algorithm.tool or f"accel-train {name}"
        self.help, self.schema, self.presets = algorithm.help, algorithm.schema, algorithm.presets
        self.curves = algorithm.curves or CURVES
        self.sections, self.example = algorithm.sections or self.sections, algorithm.example or self.example
        self.path_keys = (*RLRecipe.path_keys, *algorithm.path_keys)
        self.resume_fixed = {**RLRecipe.resume_fixed, **algorithm.resume_fixed}

    @property
    def algorithm_class(self) -> type:
        if isinstance(self.algorithm, str):
            module, _, name = self.algorithm.partition(":")
            return getattr(importlib.import_module(module), name)
        return self.algorithm

    @property
    def commands(self):
        return self.algorithm_class.commands()

    def migrate(self, config):
        return self.algorithm_class.migrate(config)

    def check(self, config, world_size):
        return self.algorithm_class.check(config, world_size, self.tool)

    def curves_for(self, config):
        return self.algorithm_class.curves_for(config) or self.curves

    def plan_of(self, config, world_size: int, inputs=None) -> Plan:
        """The run's sizes from the options alone (an RL step's do not depend on the data)."""
        return Plan(config, world_size, config.train.steps, derived(config, world_size), inputs)

    def plan(self, config, world_size, *, verbose):
        from ..train.loggers import require_loggers

        require_loggers(config.run.loggers)
        return self.plan_of(config, world_size, self.algorithm_class.load_inputs(config, verbose))

    def resolved(self, plan):
        return resolved(plan.config, plan.world_size)

    def build(self, plan, backend):
        return self.trainer_of(plan.config, inputs=plan.inputs)

    def trainer_of(self, config, run_dir=None, resume: bool = False, inputs=None):
        """The RL step (``RLTrainer``) with this recipe's algorithm, on this rank (``run_dir``, ``resume``: for its
        ``train()``)."""
        from .step import RLTrainer

        return RLTrainer(config, self.algorithm_class(config), run_dir, resume, inputs, recipe=self.name,
                         tool=self.tool)

    def ready(self, parts, start):
        parts.ready(start)

    def close(self, parts):
        parts.close()

    def step(self, parts, index):
        return parts.step(index)

    def validate(self, parts, index, *, baseline=False):
        return parts.validate(index, baseline)

    def run_model(self, config) -> export_module.RunModel:
        return export_module.RunModel(model_path=None if config.model.path == BUILTIN_MODEL else config.model.path,
                                      engine=engine_config(config, world_size=1),
                                      build=lambda: build_model(config.model))

    def done_line(self, rows, seconds):
        from ..train.report import first_and_last

        rewards = [row["reward_mean"] for row in rows if "reward_mean" in row]
        if not rewards:
            return None
        return f"{self.tool}: done in {seconds:.0f} s; reward mean {first_and_last(rewards, 10)}"

    def derived_engine_options(self, config, derived):
        return {"seed": config.train.seed, "total_steps": derived.get("total_optimizer_steps")}

    def prompt_settings(self, config, derived):
        return {"system_prompt": config.data.system_prompt, "chat_template": config.data.chat_template,
                "max_new_tokens": config.rollout.max_new_tokens}

    def prompt_keys(self):
        return PROMPT_KEYS

    # -- eval: held-out prompts scored with the run's rewards (evaluate.py; engine/train/evaluate.py does the rest)

    @property
    def eval_help(self) -> str:
        from .evaluate import eval_help

        return eval_help(self.tool)

    def eval_offload(self, config) -> bool:
        """Whether the evaluated model keeps its parameters in host memory between uses (a frozen engine's)."""
        return self.algorithm_class.eval_offload(config)

    def eval_problems(self, config, target, world_size):
        from .evaluate import problems

        return problems(config, target, world_size)

    def eval_inputs(self, config):
        from .evaluate import load_inputs

        return load_inputs(config)

    def evaluate(self, config, model_dir, backend):
        from .evaluate import evaluate

        return evaluate(config, model_dir, backend, self.eval_offload(config))


PROMPT_KEYS = {"system_prompt": "data.system_prompt", "chat_template": "data.chat_template",
               "max_new_tokens": "rollout.max_new_tokens"}
