"""``python -m accel_backends.testing NAME [--nproc 2] [--rule RULE ...]``: the conformance kit from a shell."""

import sys

from .cli import main

sys.exit(main())
