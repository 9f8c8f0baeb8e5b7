"""On-policy distillation as an algorithm of the RL step, registered as ``distill`` (``accel-distill``): the student
samples, a frozen teacher (``teacher.py``) scores the student's tokens, each token's advantage is the reverse KL on
it (``algorithm.py``). See ``docs/distill.md``."""

from .algorithm import DistillAlgorithm

__all__ = ["DistillAlgorithm"]
