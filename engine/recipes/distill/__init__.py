"""``accel-distill``: on-policy distillation on the RL layer (``engine/rl``): the student samples, a frozen teacher
scores the student's tokens, each token's advantage is the reverse KL on it (``algorithm.py``)."""

from .recipe import DistillRecipe

__all__ = ["DistillRecipe"]
