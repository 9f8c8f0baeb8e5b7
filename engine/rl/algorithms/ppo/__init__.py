"""PPO with a critic as an algorithm of the RL step, registered as ``ppo`` (``accel-ppo``): the critic is a model
the algorithm trains beside the policy (``algorithm.py``, ``critic.py``, ``critic_update.py``). See ``docs/ppo.md``."""

from .algorithm import PPOAlgorithm

__all__ = ["PPOAlgorithm"]
