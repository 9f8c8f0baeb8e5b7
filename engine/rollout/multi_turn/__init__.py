"""Multi-turn rollouts with tools and environments (``rollout.tools``, ``rollout.environment``): tool loading
and schemas (``tools.py``), tool-call parsing (``parsing.py``), the chat template between turns and its
prefix check (``template.py``), running calls (``execution.py``), the loop (``loop.py``), config checks and wiring
(``setup.py``); per-trajectory records and metrics are ``engine/rollout/trajectories.py`` (a field of every
``RolloutBatch``). See docs/agents.md."""

from ..trajectories import Trajectories, metrics
from .loop import Limits, MultiTurnRollout
from .setup import build, check, enabled

__all__ = ["Limits", "MultiTurnRollout", "Trajectories", "build", "check", "enabled", "metrics"]
