"""The parts of ``FSDPEngine`` (``engine/engine.py``), one concern each; the facade ties them together."""
