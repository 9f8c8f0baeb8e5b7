"""The commands of the built-in RL algorithms: each is the frame's command (``engine/train/cli.py``) for the one RL
recipe bound to the algorithm's registered name (``accel-grpo`` -> ``grpo``); ``accel-train NAME`` reaches any
registered algorithm the same way. ``python -m engine.rl.formulas.<name>.cli`` runs them too."""

from __future__ import annotations

import sys


def command(name: str, argv: list[str] | None = None) -> int:
    from ..train.cli import main
    from ..train.registry import get_recipe

    return main(get_recipe(name), sys.argv[1:] if argv is None else argv)


def grpo(argv: list[str] | None = None) -> int:
    return command("grpo", argv)


def ppo(argv: list[str] | None = None) -> int:
    return command("ppo", argv)


def distill(argv: list[str] | None = None) -> int:
    return command("distill", argv)
