"""Supervised fine-tuning on the shared engine (``accel-sft``), as a recipe of the training frame: data in TRL's
formats, loss masks from the chat template, the exact token-weighted loss over the global batch, packed
micro-batches. See ``docs/sft.md``."""

from .recipe import SFTRecipe

__all__ = ["SFTRecipe"]
