"""``accel-grpo``, also as ``python -m engine.rl.algorithms.grpo.cli`` (the command lives in ``engine/rl/cli.py``)."""

import sys

from ...cli import grpo as main

if __name__ == "__main__":
    sys.exit(main())
