"""Direct preference optimisation on the shared engine (``accel-dpo``), as a recipe of the training frame: pairs in
TRL's formats, a frozen reference (or LoRA's base model), chosen and rejected packed in one micro-batch, TRL's loss
types and metrics. See ``docs/preference.md``."""

from .recipe import DPORecipe

__all__ = ["DPORecipe"]
