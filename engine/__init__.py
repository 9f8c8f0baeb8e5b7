"""The shared FSDP training engine (FSDPEngine, EngineConfig): it asks ``accel_backends`` for everything
device-specific. Being built; see the open engine issue and ``docs/``."""
