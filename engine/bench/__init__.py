"""``accel-bench``: the engine's options and the GRPO step measured side by side (see ``cli.py``)."""

from .cli import main

__all__ = ["main"]
