"""``accel-ppo``: PPO with a critic (``recipe.py``)."""

from .recipe import PPORecipe

__all__ = ["PPORecipe"]
