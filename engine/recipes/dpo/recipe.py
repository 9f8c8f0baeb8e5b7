"""``accel-dpo``'s recipe: DPO on the frame (``engine/train``). What is DPO's own lives here and in this package:
the ``dpo.*`` options and presets (``config.py``), the losses and metrics (``loss.py``), the reference
(``reference.py``), the step and validation (``trainer.py``); pairs, batches and the step's frame are shared with
the reward model (``engine.rl.offline``)."""

from __future__ import annotations

from ...rl.offline import pair_eval
from ...rl.offline.pair_config import PAIR_RESUME_FIXED, plan_pairs
from ...rl.offline.run_config import resolved
from ...train import export as export_module
from ...train.recipe import Recipe
from . import trainer
from .config import PRESETS, DPOConfig, check

HELP = """Direct preference optimisation (DPO, IPO, SLiC's hinge) of a causal language model on preference pairs:
prompt/chosen/rejected as text or conversations, or chosen/rejected conversations sharing their prompt.

With no arguments: the CPU demo (2 processes; a tiny model learns synthetic preferences in about a minute). Given
a model or data of your own, the library defaults apply (TRL's: beta 0.1, sigmoid loss, lr 1e-6) unless you name a
preset with --preset. The reference is the model you start from (model.path), frozen; with LoRA, its base weights.

examples:
  accel-dpo                                       # the CPU demo
  accel-dpo model.path=/models/sft-out data.path=/data/pairs.jsonl
  accel-dpo --preset h100 model.path=/models/sft-out data.path=/data/pairs.jsonl dpo.beta=0.05
  accel-dpo --resume run.name=dpo-cpu-demo-20261201-101500
  accel-dpo export runs/NAME /models/NAME-hf      # a checkpoint as a Hugging Face model directory
  accel-dpo eval runs/NAME data.val_path=val.jsonl

Ctrl-C or SIGTERM finishes the current step, saves it and stops; the last line says how to resume.
Options, data formats and metrics: docs/preference.md.
"""


class DPORecipe(Recipe):
    name, tool, help = "dpo", "accel-dpo", HELP
    schema, presets, curves = DPOConfig, PRESETS, trainer.CURVES
    sections, example = "model, data, train, dpo, run, engine", "dpo.beta=0.05"

    resume_fixed = {**PAIR_RESUME_FIXED, "dpo.ref_model": "the reference the rewards are measured against"}
    eval_help = pair_eval.HELP.format(tool="accel-dpo", metrics="val/rewards/*, val/logps/*")

    def check(self, config, world_size):
        return check(config, world_size)

    def plan(self, config, world_size, *, verbose):
        return plan_pairs(self.tool, config, world_size, verbose=verbose)

    def resolved(self, plan):
        return resolved(plan.config, plan.derived)

    def build(self, plan, backend):
        return trainer.build(plan, backend)

    def step(self, parts, index):
        return trainer.dpo_step(parts, index)

    def validate(self, parts, index, *, baseline=False):
        return trainer.validate(parts, index, baseline)

    def derived_engine_options(self, config, derived):
        return {"seed": config.train.seed, "total_steps": derived.get("total_steps")}

    def eval_problems(self, config, target, world_size):
        found = pair_eval.problems(config, target) + check(config, world_size)
        if "model" in target and config.dpo.ref_model is None:
            found.append("evaluating a model directory needs dpo.ref_model=DIR, the reference its rewards are "
                         "measured against (the model DPO started from)")
        return found

    def eval_inputs(self, config):
        return pair_eval.inputs(config)

    def evaluate(self, config, weights, backend):
        return trainer.evaluate(config, weights, backend)

    def run_model(self, config) -> export_module.RunModel:
        from ...rl.offline.model_files import load_tokenizer
        from ...rl.offline.run_config import engine_config

        path = config.model.path
        return export_module.RunModel(model_path=path, engine=engine_config(config, 1),
                                      build=lambda: (load_tokenizer(path), path))

    def done_line(self, rows, seconds):
        rows = [row for row in rows if "loss" in row]
        if not rows:
            return None
        final = rows[-5:]
        line = (f"{self.tool}: done in {seconds:.0f} s; loss {rows[0]['loss']:.3f} at the first step, "
                f"{sum(r['loss'] for r in final) / len(final):.3f} over the last {len(final)}, reward accuracy "
                f"{sum(r['rewards/accuracies'] for r in final) / len(final):.3f}")
        vals = [row for row in rows if "val/loss" in row]
        if vals:
            line += (f"; validation loss {vals[-1]['val/loss']:.3f}, reward accuracy "
                     f"{vals[-1]['val/rewards/accuracies']:.3f}")
        return line
