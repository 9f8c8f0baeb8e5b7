"""Reward-model training on the shared engine (``accel-rm``), as a recipe of the training frame: a Bradley-Terry
model (a sequence-classification head on a causal LM) from preference pairs in TRL's formats, chosen and rejected
packed in one micro-batch. See ``docs/preference.md``."""

from .recipe import RewardModelRecipe

__all__ = ["RewardModelRecipe"]
