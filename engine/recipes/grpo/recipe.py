"""``accel-grpo``'s recipe: GRPO (and its loss-type variants) on the frame (``engine/train``). What is GRPO's own
lives in its modules: the schema, presets, migrations and checks (``config.py``), the parts and the step
(``trainer.py``), validation, rewards, prompt data and the policy loss."""

from __future__ import annotations

from ...train import export as export_module
from ...train.recipe import Plan, Recipe
from . import config as grpo_config
from .evaluate import HELP as EVAL_HELP
from .report import CURVES, curves_for

HELP = """GRPO post-training of a causal language model on prompts with a reward (GSM8K-style data and your own
reward functions; multi-turn rollouts with tools).

With no arguments: the CPU demo (2 processes, a tiny built-in model learns a synthetic task). Given a model or data
of your own, the library defaults apply (up to 512 new tokens per response, the GSM8K answer check as the reward
unless data.reward names yours) unless you name a preset with --preset.

examples:
  accel-grpo                                      # the CPU demo
  accel-grpo model.path=/models/Qwen2.5-0.5B-Instruct data.path=/data/gsm8k/train.parquet
  accel-grpo --preset h100 model.path=/models/Qwen2.5-0.5B-Instruct data.path=/data/gsm8k/train.jsonl
  accel-grpo --config my.yaml train.steps=100 rollout.n=16
  accel-grpo --resume run.name=grpo-cpu-demo-20261129-101500
  accel-grpo make-tiny-model /tmp/tiny-qwen       # a tiny random model directory, to try the real-model path
  accel-grpo export runs/NAME /models/NAME-hf     # a checkpoint as a Hugging Face model directory
  accel-grpo eval runs/NAME data.val_path=test.jsonl

The device comes from ACCEL_BACKEND or is detected. --nproc N starts N worker processes on this machine; under
torchrun the command joins that job instead (several machines). A failing worker ends the run with exit status 1.
Ctrl-C or SIGTERM finishes the current step, saves it and stops (exit status 130 / 143); the last line says how to
resume. Options and metrics: docs/grpo.md.
"""


class GRPORecipe(Recipe):
    name, tool, help = "grpo", "accel-grpo", HELP
    schema, presets, curves = grpo_config.GRPOConfig, grpo_config.PRESETS, CURVES
    sections, example = "model, data, rollout, algorithm, train, run, engine", "train.steps=10 rollout.n=4"

    # --resume may not change what the run means (the frame adds the model, LoRA and the trainer).
    resume_fixed = {**Recipe.resume_fixed, "rollout.n": "the group size", "algorithm.loss_type": "the loss",
                    **{f"data.{key}": "the run's data" for key in (
                        "task", "path", "val_fraction", "prompt_key", "answer_key", "reward", "reward_weights",
                        "reward_style", "chat_template", "system_prompt")}}
    eval_help = EVAL_HELP

    @property
    def commands(self):
        from .tiny_model_command import main as make_tiny_model_main

        return {"make-tiny-model": make_tiny_model_main}

    def migrate(self, config):
        return grpo_config.apply_loss_type(config)

    def check(self, config, world_size):
        return grpo_config.check(config, world_size)

    def plan_of(self, config, world_size: int, inputs=None) -> Plan:
        """The run's sizes from the options alone (GRPO's do not depend on the data)."""
        return Plan(config, world_size, config.train.steps, grpo_config.derived(config, world_size), inputs)

    def plan(self, config, world_size, *, verbose):
        from ...train.loggers import require_loggers
        from .trainer import load_inputs

        require_loggers(config.run.loggers)
        return self.plan_of(config, world_size, load_inputs(config, verbose=verbose))

    def resolved(self, plan):
        return grpo_config.resolved(plan.config, plan.world_size)

    def build(self, plan, backend):
        from .trainer import GRPOTrainer

        return GRPOTrainer(plan.config, inputs=plan.inputs)

    def ready(self, parts, start):
        parts.ready(start)

    def close(self, parts):
        parts.close()

    def step(self, parts, index):
        return parts.step(index)

    def validate(self, parts, index, *, baseline=False):
        return parts.validate(index, baseline)

    def run_model(self, config) -> export_module.RunModel:
        from ...rl.model import BUILTIN_MODEL, build_model

        return export_module.RunModel(model_path=None if config.model.path == BUILTIN_MODEL else config.model.path,
                                      engine=grpo_config.engine_config(config, world_size=1),
                                      build=lambda: build_model(config.model))

    def done_line(self, rows, seconds):
        from ...train.report import first_and_last

        rewards = [row["reward_mean"] for row in rows if "reward_mean" in row]
        if not rewards:
            return None
        return f"{self.tool}: done in {seconds:.0f} s; reward mean {first_and_last(rewards, 10)}"

    def curves_for(self, config):
        return curves_for(config.algorithm)

    def derived_engine_options(self, config, derived):
        return {"seed": config.train.seed, "total_steps": derived.get("total_optimizer_steps")}

    def prompt_settings(self, config, derived):
        return {"system_prompt": config.data.system_prompt, "chat_template": config.data.chat_template,
                "max_new_tokens": config.rollout.max_new_tokens}

    def prompt_keys(self):
        return PROMPT_KEYS

    # -- eval: held-out prompts scored with the run's rewards (engine/train/evaluate.py does the rest) ---------

    def eval_problems(self, config, target, world_size):
        from .evaluate import problems

        return problems(config, target, world_size)

    def eval_inputs(self, config):
        from .evaluate import load_inputs

        return load_inputs(config)

    def evaluate(self, config, model_dir, backend):
        from .evaluate import evaluate

        return evaluate(config, model_dir, backend)


PROMPT_KEYS = {"system_prompt": "data.system_prompt", "chat_template": "data.chat_template",
               "max_new_tokens": "rollout.max_new_tokens"}
