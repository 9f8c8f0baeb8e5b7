"""``accel-ppo``, also as ``python -m engine.rl.algorithms.ppo.cli`` (the command lives in ``engine/rl/cli.py``)."""

import sys

from ...cli import ppo as main

if __name__ == "__main__":
    sys.exit(main())
