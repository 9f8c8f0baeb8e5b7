"""GRPO post-training on the shared engine (``accel-grpo``), as a recipe of the training frame. See
``docs/grpo.md``. The RL layer's modules that lived here are aliased in ``engine/compat.py``."""

from .recipe import GRPORecipe

__all__ = ["GRPORecipe"]
