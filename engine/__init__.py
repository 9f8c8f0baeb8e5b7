"""The shared FSDP engine: it shards, trains, offloads and checkpoints a model, and asks ``accel_backends`` for
everything device-specific."""

from accel_backends.collector import paused_collector

with paused_collector():  # FSDP, DCP and transformers: lasting objects, no garbage (accel_backends/collector.py)
    from . import compat
    from .config import EngineConfig
    from .engine import FSDPEngine
    from .fsdp.model_prep import apply_lora

compat.install()  # old module paths (engine/compat.py)

__all__ = ["EngineConfig", "FSDPEngine", "apply_lora"]
