"""What ``accel-grpo`` and ``accel-sft`` share on their command line: the training run's arguments (``--preset``,
``--config``, ``--nproc``, ``--resume``, ``--print-config``, ``key=value`` overrides) and the dispatch of the
sub-commands (``export``, ``eval``, ...) that come before them. Each trainer gives its own help texts."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from .workers import parse_nproc


def parse_run_args(argv: list[str], tool: str, description: str, presets, *, sections: str, print_config: str,
                   example: str) -> argparse.Namespace:
    """A training run's arguments; ``sections`` lists the YAML file's sections, ``print_config`` says what
    ``--print-config`` checks, ``example`` is a pair of overrides."""
    parser = argparse.ArgumentParser(prog=tool, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help=f"one of {', '.join(presets)} (default cpu-demo)")
    parser.add_argument("--config", help=f"a YAML file of sections ({sections})")
    parser.add_argument("--nproc", type=parse_nproc,
                        help="worker processes on this node, or auto: one per visible device (default: the preset's)")
    parser.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    parser.add_argument("--print-config", action="store_true", help=print_config)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=f"e.g. {example}")
    return parser.parse_intermixed_args(argv)


def run_subcommand(argv: list[str], package: str, commands: dict[str, str | Callable[[list[str]], int]]) -> int | None:
    """The exit status of the sub-command ``argv`` starts with, or None when it names none (a training run). A
    command is a function of the remaining arguments, or a module of ``package`` (imported only when named) whose
    ``main`` is that function."""
    command = commands.get(argv[0]) if argv else None
    if command is None:
        return None
    if isinstance(command, str):
        command = importlib.import_module(command, package).main
    return command(argv[1:])
