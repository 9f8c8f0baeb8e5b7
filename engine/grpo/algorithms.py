"""``engine.grpo.algorithms`` (public contract): GRPO's formulas, kept at their old import path; they live in
``engine/recipes/grpo/algorithms.py``."""

import sys

from ..recipes.grpo import algorithms

sys.modules[__name__] = algorithms  # one module under both names: the same functions and constants
