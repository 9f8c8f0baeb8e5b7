"""GRPO's first home: ``accel-grpo`` starts in ``cli.py``; the old module paths under it are aliases
(``engine/compat.py``)."""
