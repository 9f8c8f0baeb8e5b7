"""The shared FSDP engine: it shards, trains, offloads and checkpoints a model, and asks ``accel_backends`` for
everything device-specific."""

from . import compat
from .config import EngineConfig
from .engine import FSDPEngine
from .fsdp.model_prep import apply_lora

compat.install()  # old module paths (engine/compat.py)

__all__ = ["EngineConfig", "FSDPEngine", "apply_lora"]
