"""``accel-distill``, also as ``python -m engine.rl.algorithms.distill.cli`` (the command lives in
``engine/rl/cli.py``)."""

import sys

from ...cli import distill as main

if __name__ == "__main__":
    sys.exit(main())
