"""The one command of every trainer (``accel-grpo``, ``accel-sft``, ``accel-train TRAINER``): the run's arguments
(``--preset``, ``--config``, ``--nproc``, ``--resume``, ``--print-config``, ``key=value`` overrides), the one config
pipeline (``load``), the dispatch of the sub-commands (``export`` and the recipe's own) and the launch of the
frame's loop on every worker. A recipe gives its help text, schema, checks and plan."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .workers import parse_nproc, world_size


def parse_run_args(argv: list[str], tool: str, description: str, presets, *, sections: str, print_config: str,
                   example: str) -> argparse.Namespace:
    """A training run's arguments; ``sections`` lists the YAML file's sections, ``print_config`` says what
    ``--print-config`` checks, ``example`` is a pair of overrides."""
    parser = argparse.ArgumentParser(prog=tool, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help=f"one of {', '.join(presets)} (default: cpu-demo when neither model.path nor "
                                         "data.path is given, else default: the library defaults)")
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
                steps: int, args: tuple = ()) -> int | None:
    """Say what runs where (rank 0), run ``worker`` on every rank and wait: the exit status of a run that ended
    early (a failed rank, an interrupt: with how to resume), None when it finished."""
    from ..runtime import Interrupted, WorkerFailed, report_early_end, run
    from .run_dir import resume_hint

    if is_rank0():
        print(f"{tool}: preset {config.preset}, backend {backend.name} ({backend.dist_backend}), {workers} "
              f"process(es), {steps} steps; run directory {directory}", flush=True)
    try:
        run(worker, workers, *(args or (config.to_dict(),)), str(directory), resume)
    except (WorkerFailed, Interrupted) as exc:
        return report_early_end(tool, exc, resume_hint(directory, tool))
    return None


def print_outputs(directory: Path) -> None:
    """Where a finished run left its metrics, curves and checkpoints."""
    curves = directory / "curves.png"
    drawn = curves if curves.exists() else "not drawn (matplotlib is not installed)"
    print(f"metrics: {directory / 'metrics.jsonl'}\ncurves:  {drawn}\ncheckpoints: {directory / 'checkpoints'}")


def load(recipe, preset: str | None, config_file: str | None, overrides: list[str], *, base=None):
    """The one config pipeline: ``base`` (a run's config, a model directory's preset) or the preset chosen by
    ``choose_preset``, then the YAML file, then the overrides, then the recipe's migrations. Returns
    ``(config, notices, why)``: the migrations' notices and why that preset applies."""
    import copy

    from .config import apply, build_config, choose_preset, parse_override, read_config_file

    file_data = read_config_file(config_file) if config_file else {}
    if base is None:
        name, why = choose_preset(recipe.presets, preset, file_data, overrides)
        config = build_config(recipe.schema, recipe.presets, name, None, [])
    else:
        if preset:
            raise ValueError("--preset is for a new config: this one starts from an existing configuration")
        config, why = copy.deepcopy(base), "the run's own configuration"
    apply(config, file_data)
    for override in overrides:
        apply(config, parse_override(override))
    return config, recipe.migrate(config), why


def main(recipe, argv: list[str]) -> int:
    """``accel-<trainer> [--preset P] [--config F] [--nproc N] [--resume] [--print-config] key=value...``, and the
    sub-commands ``export``, ``eval`` and the recipe's own."""
    import json
    import time

    from .config import require_valid
    from .loop import worker
    from .report import read_metrics
    from .run_dir import run_dir

    status = run_subcommand(argv, __package__, {**recipe.commands, "export": lambda rest: export_main(recipe, rest)})
    if status is not None:
        return status
    args = parse_run_args(argv, recipe.tool, recipe.help, recipe.presets, sections=recipe.sections,
                          print_config="check the config and the inputs, print the config resolved and exit",
                          example=recipe.example)
    import accel_backends

    tool = recipe.tool
    try:
        config, notices, why = load(recipe, args.preset, args.config, args.overrides)
        for notice in notices if is_rank0() else ():
            print(f"{tool}: notice: {notice}", file=sys.stderr)
        if args.nproc is not None:
            config.nproc = args.nproc  # --nproc beats nproc from anywhere else, and config.json records it
        workers = world_size(config, args.nproc)
        require_valid(recipe.check(config, workers))
        plan = recipe.plan(config, workers, verbose=is_rank0() and not args.print_config)
        if args.print_config:
            print(f"{tool}: preset {config.preset} ({why})", file=sys.stderr)
            print(json.dumps(recipe.resolved(plan), indent=2))  # stdout stays valid JSON
            return 0
        backend = accel_backends.get_backend()  # an unknown or unusable backend stops us here
        directory = run_dir(config, args.resume, recipe.name)
        if args.resume:
            from .. import checkpoint

            if checkpoint.latest_complete(directory / "checkpoints") is None:
                raise FileNotFoundError(f"--resume: no checkpoint in {directory / 'checkpoints'}")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(recipe.resolved(plan), indent=2))
    except (ValueError, FileNotFoundError, accel_backends.AccelBackendError) as exc:
        return input_error(tool, exc)
    started = time.perf_counter()
    status = run_workers(tool, worker, config, workers, directory, args.resume, backend=backend,
                         steps=plan.total_steps, args=(recipe.name, config.to_dict(), workers))
    if status is not None or not is_rank0():
        return status or 0
    line = recipe.done_line(read_metrics(directory / "metrics.jsonl"), time.perf_counter() - started)
    if line:
        print(line)
    print_outputs(directory)
    return 0


def export_main(recipe, argv: list[str]) -> int:
    """``<tool> export RUN_DIR|CHECKPOINT OUT``: the run's config read with the recipe's schema, its model built by
    the recipe (``Recipe.run_model``), the rest shared (``export.py``)."""
    from . import export

    return export.main(argv, lambda run_dir: recipe.run_model(export.read_run_config(run_dir, recipe)), recipe.tool)


def generic_main(argv: list[str] | None = None) -> int:
    """``accel-train TRAINER ...`` (``python -m engine.train``): the command of any registered trainer, built-in or
    from a plugin; ``accel-train TRAINER --help`` shows that trainer's options."""
    from .registry import RecipeError, get_recipe, recipe_names

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: accel-train TRAINER [--preset NAME] [--config FILE] [--nproc N] [--resume] [--print-config] "
              f"[key=value ...]\n       accel-train TRAINER export|eval ...\n\ntrainers: {', '.join(recipe_names())}",
              file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        recipe = get_recipe(argv[0])
    except RecipeError as exc:
        return input_error("accel-train", exc)
    return main(recipe, argv[1:])
