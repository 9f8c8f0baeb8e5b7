"""Rollout engines: the interface the trainer samples through (``base.py``), the built-in ``hf`` and
``hf-continuous`` engines, and the registry that finds them and third-party ones through the
``register_rollout_engines`` hook (``hookspecs.py``). See docs/grpo.md, "Rollout engines"."""

from .base import Responses, RolloutContext, RolloutEngine, SamplingConfig, sampling_scores
from .hf import left_padded, mask_through_first_eos
from .registry import RolloutEngineError, check_engine, create_rollout_engine, engine_names

__all__ = ["Responses", "RolloutContext", "RolloutEngine", "RolloutEngineError", "SamplingConfig",
           "check_engine", "create_rollout_engine", "engine_names", "left_padded", "mask_through_first_eos",
           "sampling_scores"]
