"""engine/rl: the modules that moved out of the GRPO recipe (issue 36) keep their old import paths, as the very same
module objects (a class or constant imported either way is one and the same)."""

import importlib

import pytest

MOVED = ("ahead", "algorithms", "batches", "evaluate", "groups", "logprobs", "model", "prompt_types", "prompts",
         "rewards", "rollout_correction", "scoring", "step_metrics", "tokenizer", "validation")


@pytest.mark.parametrize("name", MOVED)
def test_old_recipe_paths_are_the_rl_modules(name):
    new = "formulas" if name == "algorithms" else name  # engine/rl/algorithms.py is engine/rl/formulas.py (issue 47)
    assert importlib.import_module(f"engine.recipes.grpo.{name}") is importlib.import_module(f"engine.rl.{new}")


def test_public_compatibility_names():
    import engine.grpo.algorithms
    import engine.grpo.tasks
    import engine.rl.formulas
    import engine.rl.prompts

    assert engine.grpo.algorithms is engine.rl.formulas
    assert engine.grpo.tasks.echo_reward is engine.rl.prompts.echo_reward
    from engine.rl import sizes
    from engine.rl.algorithms.grpo.config import mini_batch_sequences, prompts_per_rank, updates_per_step

    assert (mini_batch_sequences, prompts_per_rank, updates_per_step) == (
        sizes.mini_batch_sequences, sizes.prompts_per_rank, sizes.updates_per_step)
