"""What ``accel-grpo`` and ``accel-sft`` share on their command line: the training run's arguments (``--preset``,
``--config``, ``--nproc``, ``--resume``, ``--print-config``, ``key=value`` overrides) and the dispatch of the
sub-commands (``export``, ``eval``, ...) that come before them. Each trainer gives its own help texts."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

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


def is_rank0() -> bool:
    """Under torchrun every rank runs the CLI; only rank 0 speaks."""
    return os.environ.get("RANK", "0") == "0"


def input_error(tool: str, exc: Exception) -> int:
    """Bad input found before any worker starts: one line, exit status 2."""
    print(f"{tool}: error: {exc}", file=sys.stderr)
    return 2


def run_workers(tool: str, worker: Callable, config, workers: int, directory: Path, resume: bool, *, backend,
                steps: int) -> int | None:
    """Say what runs where (rank 0), run ``worker`` on every rank and wait: the exit status of a run that ended
    early (a failed rank, an interrupt: with how to resume), None when it finished."""
    from ..runtime import Interrupted, WorkerFailed, report_early_end, run
    from .run_dir import resume_hint

    if is_rank0():
        print(f"{tool}: preset {config.preset}, backend {backend.name} ({backend.dist_backend}), {workers} "
              f"process(es), {steps} steps; run directory {directory}", flush=True)
    try:
        run(worker, workers, config.to_dict(), str(directory), resume)
    except (WorkerFailed, Interrupted) as exc:
        return report_early_end(tool, exc, resume_hint(directory, tool))
    return None


def print_outputs(directory: Path) -> None:
    """Where a finished run left its metrics, curves and checkpoints."""
    print(f"metrics: {directory / 'metrics.jsonl'}\ncurves:  {directory / 'curves.png'}\n"
          f"checkpoints: {directory / 'checkpoints'}")
