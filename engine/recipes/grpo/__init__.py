"""GRPO post-training on the shared engine (``accel-grpo``), as a recipe of the training frame. See
``docs/grpo.md``."""

import sys

from ...rl import (
    ahead,
    algorithms,
    batches,
    groups,
    logprobs,
    model,
    prompt_types,
    prompts,
    rewards,
    rollout_correction,
    scoring,
    step_metrics,
    tokenizer,
    validation,
)
from .recipe import GRPORecipe

# The modules that moved to the RL layer (engine/rl, issue 36) under the paths that tests, plugins and scripts written
# before it import them by (engine.recipes.grpo.prompts, ...): the same module objects.
for _module in (ahead, algorithms, batches, groups, logprobs, model, prompt_types, prompts, rewards,
                rollout_correction, scoring, step_metrics, tokenizer, validation):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module

__all__ = ["GRPORecipe"]
