"""Rollouts: the engines that sample (``engines/``: ``hf``, ``hf-continuous``, ``vllm`` and plugins through the
``register_rollout_engines`` hook), the single-turn loop (``single_turn.py``) and the multi-turn loop with tools
and environments (``multi_turn/``), both behind one ``Sampler`` (``sampler.py``) returning one ``RolloutBatch``.
It stands on the engine's public API and imports nothing above it (no trainer)."""

from .engines import (
    Responses,
    RolloutContext,
    RolloutEngine,
    RolloutEngineError,
    SamplingConfig,
    check_engine,
    create_rollout_engine,
    engine_names,
    hookspecs,
)
from .sampler import Sampler, build_sampler
from .single_turn import RolloutBatch, SingleTurnRollout, eos_token_ids, rollout, sampling_configs, sync_weights
from .trajectories import Trajectories

__all__ = ["Responses", "RolloutBatch", "RolloutContext", "RolloutEngine", "RolloutEngineError", "Sampler",
           "SamplingConfig", "SingleTurnRollout", "Trajectories", "build_sampler", "check_engine",
           "create_rollout_engine", "engine_names", "eos_token_ids", "hookspecs", "rollout", "sampling_configs",
           "sync_weights"]
