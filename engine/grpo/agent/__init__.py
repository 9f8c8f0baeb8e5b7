"""Multi-turn rollouts with tools and environments (``rollout.tools``, ``rollout.environment``): tool loading
and schemas (``tools.py``), tool-call parsing (``parsing.py``), the chat template between turns and its
prefix check (``template.py``), running calls (``execution.py``), the loop (``loop.py``), per-trajectory records
and metrics (``trajectories.py``), config checks and wiring (``setup.py``). See docs/agents.md."""

from .loop import Limits, MultiTurnRollout
from .setup import build, check, enabled, environment_rewards
from .trajectories import Trajectories, metrics

__all__ = ["Limits", "MultiTurnRollout", "Trajectories", "build", "check", "enabled", "environment_rewards",
           "metrics"]
