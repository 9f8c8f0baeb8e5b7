"""GRPO post-training on the shared engine (``accel-grpo``), as a recipe of the training frame. See
``docs/grpo.md``."""

from .recipe import GRPORecipe

__all__ = ["GRPORecipe"]
