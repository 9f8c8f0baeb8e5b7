"""``accel-dpo`` (and ``python -m engine.offline.objectives.dpo.cli``): the frame's command for the
registered ``dpo`` recipe."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from ....train.cli import main as command
    from ....train.registry import get_recipe

    return command(get_recipe("dpo"), sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
