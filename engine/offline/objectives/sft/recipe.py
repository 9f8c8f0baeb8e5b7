"""``accel-sft``'s recipe: supervised fine-tuning on the frame (``engine/train``). What is SFT's own lives here and
in this package's modules: the schema and presets (``config.py``), the data and its masks (``dataset.py``), the
batch schedule (``batches.py``), the step and validation (``trainer.py``)."""

from __future__ import annotations

import sys

from ....train.recipe import Plan, Recipe
from ...recipe import OfflineRecipe
from ...run_config import command_help
from . import evaluate, trainer
from .config import PRESETS, SFTConfig, check

HELP = """Supervised fine-tuning of a causal language model on chat, prompt-completion or plain-text data.

With no arguments: the CPU demo (2 processes; a tiny model learns a synthetic chat task in about a minute).
Given a model or data of your own, the library defaults apply (examples of up to 1024 tokens) unless you name a
preset with --preset.

""" + command_help("accel-sft", "model.path=/models/Qwen2.5-0.5B data.path=/data/chat.jsonl",
                         doc="docs/sft.md")


class SFTRecipe(OfflineRecipe):
    name, tool, help = "sft", "accel-sft", HELP
    schema, presets, curves, trainer = SFTConfig, PRESETS, trainer.CURVES, trainer
    sections, example = "model, data, train, run, engine", "train.batch_size=32"

    # --resume may not change what the run means (the frame adds the model, LoRA and the trainer).
    resume_fixed = {**Recipe.resume_fixed, "train.loss_on": "which tokens are trained",
                    "train.batch_size": "the run's batches", "train.batch_tokens": "the run's batches",
                    "train.seed": "the run's batches",
                    **{f"data.{key}": "the run's data" for key in (
                        "path", "format", "text_key", "messages_key", "prompt_key", "completion_key", "tools_key",
                        "max_length", "truncation", "empty_mask", "val_fraction", "demo_examples")}}
    eval_help, eval_exports = evaluate.HELP, False  # eval loads a run's checkpoint into the run's model itself

    def check(self, config, world_size):
        return check(config, world_size)

    def plan(self, config, world_size, *, verbose):
        from ....train.loggers import require_loggers
        from ...epochs import schedule
        from ...model_files import load_tokenizer, resolve_model_path
        from .dataset import build_data

        require_loggers(config.run.loggers)
        resolve_model_path(config)  # the demo model's directory: config.json records the real path
        data = build_data(config.data, config.train.loss_on, load_tokenizer(config.model.path), config.train.seed)
        t = config.train
        batches = schedule([len(item.ids) for item in data.train], batch_size=t.batch_size,
                           batch_tokens=t.batch_tokens, epochs=t.epochs, steps=t.steps, seed=t.seed)
        if verbose:
            chosen = " (data.format=auto chose it)" if config.data.format == "auto" and config.data.path else ""
            print(f"{self.tool}: data: {data.summary()}{chosen}", file=sys.stderr)
        derived = {"world_size": world_size, "total_steps": len(batches), "format": data.format,
                   "loss_on": data.loss_on, "train_examples": len(data.train), "val_examples": len(data.val)}
        return Plan(config, world_size, len(batches), derived, inputs=(data, batches))

    def prompt_settings(self, config, derived):
        return evaluate.prompt_settings(config)

    def eval_problems(self, config, target, world_size):
        return evaluate.problems(config, target, world_size)

    def eval_inputs(self, config):
        return evaluate.load_inputs(config)

    def evaluate(self, config, weights, backend):
        return evaluate.evaluate(config, weights, backend)

    def done_line(self, rows, seconds):
        from ....train.report import first_and_last

        rows = [row for row in rows if "loss" in row]
        if not rows:
            return None
        line = f"{self.tool}: done in {seconds:.0f} s; loss {first_and_last([r['loss'] for r in rows], 5)}"
        vals = [row for row in rows if "val/loss" in row]
        if vals:
            line += (f"; validation loss {vals[-1]['val/loss']:.3f}, token accuracy "
                     f"{vals[-1]['val/mean_token_accuracy']:.3f}")
        return line
