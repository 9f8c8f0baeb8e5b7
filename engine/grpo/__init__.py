"""Compatibility names for GRPO, which is the ``grpo`` recipe of the training frame (``engine/recipes/grpo``):
``engine.grpo.algorithms`` (public), ``python -m engine.grpo.cli``, ``engine.grpo.tasks:echo_reward`` in configs and
``engine.grpo.rollout_engines`` for rollout-engine plugins."""
