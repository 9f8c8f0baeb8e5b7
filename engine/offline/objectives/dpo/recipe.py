"""``accel-dpo``'s recipe: DPO on the frame (``engine/train``). What is DPO's own lives here and in this package:
the ``dpo.*`` options and presets (``config.py``), the losses and metrics (``loss.py``), the reference
(``reference.py``), the step and validation (``trainer.py``); pairs, batches and the step's frame are shared with
the reward model (``engine.offline``)."""

from __future__ import annotations

from ... import pair_eval
from ...pair_recipe import PairRecipe
from ...run_config import command_help
from . import trainer
from .config import PRESETS, DPOConfig, check

HELP = """Direct preference optimisation (DPO, IPO, SLiC's hinge) of a causal language model on preference pairs:
prompt/chosen/rejected as text or conversations, or chosen/rejected conversations sharing their prompt.

With no arguments: the CPU demo (2 processes; a tiny model learns synthetic preferences in about a minute). Given
a model or data of your own, the library defaults apply (TRL's: beta 0.1, sigmoid loss, lr 1e-6) unless you name a
preset with --preset. The reference is the model you start from (model.path), frozen; with LoRA, its base weights.

""" + command_help("accel-dpo", "model.path=/models/sft-out data.path=/data/pairs.jsonl",
                         preset_extra=" dpo.beta=0.05", doc="docs/preference.md")


class DPORecipe(PairRecipe):
    name, tool, help = "dpo", "accel-dpo", HELP
    schema, presets, curves, trainer = DPOConfig, PRESETS, trainer.CURVES, trainer
    sections, example = "model, data, train, dpo, run, engine", "dpo.beta=0.05"
    accuracy = ("rewards/accuracies", "reward accuracy")
    resume_fixed = {**PairRecipe.resume_fixed, "dpo.ref_model": "the reference the rewards are measured against"}
    eval_help = pair_eval.HELP.format(tool="accel-dpo", metrics="val/rewards/*, val/logps/*")

    def check_options(self, config, world_size):
        return check(config, world_size)

    def eval_problems(self, config, target, world_size):
        found = super().eval_problems(config, target, world_size)
        if "model" in target and config.dpo.ref_model is None:
            found.append("evaluating a model directory needs dpo.ref_model=DIR, the reference its rewards are "
                         "measured against (the model DPO started from)")
        return found
