"""``engine.grpo.algorithms`` (public contract): the RL layer's formulas, kept at their old import path; they live in
``engine/rl/algorithms.py``."""

import sys

from ..rl import algorithms

sys.modules[__name__] = algorithms  # one module under both names: the same functions and constants
