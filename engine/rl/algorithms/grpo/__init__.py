"""GRPO (and its loss-type variants, RLOO and REINFORCE++ advantages, DAPO's dynamic sampling) as an algorithm of the
RL step, registered as ``grpo`` (``accel-grpo``). See ``docs/grpo.md``."""

from .algorithm import GRPOAlgorithm

__all__ = ["GRPOAlgorithm"]
