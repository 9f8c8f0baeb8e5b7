"""The built-in trainers, registered through the same hook as a third party's, by name: the frame imports no
recipe until one is chosen."""

from accel_backends import hookimpl

from . import hookspecs  # noqa: F401 - the hook below must be specified before this module is registered


@hookimpl
def register_recipes(register):
    register("grpo", "engine.recipes.grpo:GRPORecipe")
    register("sft", "engine.offline.objectives.sft:SFTRecipe")
    register("distill", "engine.recipes.distill:DistillRecipe")
    register("dpo", "engine.offline.objectives.dpo:DPORecipe")
    register("rm", "engine.offline.objectives.rm:RewardModelRecipe")
    register("ppo", "engine.recipes.ppo:PPORecipe")
