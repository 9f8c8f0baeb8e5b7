"""The built-in trainers and RL algorithms, registered through the same hooks as a third party's, by name: the frame
imports no recipe or algorithm until one is chosen. Every registered algorithm runs on the one RL recipe
(``RL_RECIPE``), bound to its name."""

from accel_backends import hookimpl

from . import hookspecs  # noqa: F401 - the hook below must be specified before this module is registered


@hookimpl
def register_recipes(register):
    register("sft", "engine.offline.objectives.sft:SFTRecipe")
    register("dpo", "engine.offline.objectives.dpo:DPORecipe")
    register("rm", "engine.offline.objectives.rm:RewardModelRecipe")


@hookimpl
def register_algorithms(register):
    register("grpo", "engine.rl.algorithms.grpo:GRPOAlgorithm")
    register("ppo", "engine.rl.algorithms.ppo:PPOAlgorithm")
    register("distill", "engine.rl.algorithms.distill:DistillAlgorithm")


RL_RECIPE = "engine.rl.recipe:RLRecipe"  # the recipe every registered algorithm runs on
