"""The one command of every trainer (``accel-grpo``, ``accel-sft``, ``accel-train TRAINER``): the run's arguments
(``--preset``, ``--config``, ``--nproc``, ``--resume``, ``--print-config``, ``key=value`` overrides), the one config
pipeline (``load``), the dispatch of the sub-commands (``export`` and the recipe's own) and the launch of the
frame's loop on every worker. A recipe gives its help text, schema, checks and plan."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from .pipeline import load  # noqa: F401  (the one config pipeline, by its usual name)
from .run_dir import TRACEBACKS, unwritable
from .workers import is_rank0, parse_nproc, world_size


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
    parser.add_argument("--resume", action="store_true",
                        help="continue run.name from its latest checkpoint, with its recorded config.json and only "
                             "the options given now")
    parser.add_argument("--print-config", action="store_true", help=print_config)
    parser.add_argument("--traceback", action="store_true",
                        help="print the workers' tracebacks when one fails (default: a file in the run directory)")
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


def input_error(tool: str, exc: Exception) -> int:
    """Bad input found before any worker starts: one line, exit status 2."""
    print(f"{tool}: error: {exc}", file=sys.stderr)
    return 2


def run_workers(tool: str, worker: Callable, config, workers: int, directory: Path, resume: bool, *, backend,
                steps: int, args: tuple = (), resumed: str = "", traceback: bool = False) -> int | None:
    """Say what runs where (rank 0; ``resumed``: from which step, what changed), run ``worker`` on every rank and
    wait: the exit status of a run that ended early (a failed rank, an interrupt: with how to resume), None when it
    finished. A failure ends with one line; the tracebacks go to the run directory unless ``traceback``."""
    from ..runtime import Interrupted, WorkerFailed, report_early_end, run
    from .run_dir import resume_hint

    if is_rank0():
        print(f"{tool}: preset {config.preset}, backend {backend.name} ({backend.dist_backend}), {workers} "
              f"process(es), {steps} steps; run directory {directory}" + (f"; {resumed}" if resumed else ""),
              flush=True)
    try:
        run(worker, workers, *(args or (config.to_dict(),)), str(directory), resume)
    except (WorkerFailed, Interrupted) as exc:
        return report_early_end(tool, exc, resume_hint(directory, tool),
                                traceback_file=None if traceback else directory / TRACEBACKS)
    return None


def print_outputs(directory: Path) -> None:
    """Where a finished run left its metrics, curves and checkpoints."""
    curves = directory / "curves.png"
    drawn = curves if curves.exists() else "not drawn (matplotlib is not installed)"
    print(f"metrics: {directory / 'metrics.jsonl'}\ncurves:  {drawn}\ncheckpoints: {directory / 'checkpoints'}")


def no_imports_from_the_working_directory() -> None:
    """``python -m engine.rl.algorithms.grpo.cli`` (and ``torchrun -m``) put the working directory first on
    ``sys.path``: a file there named like a vendor's package would be imported by the launcher's backend probe and by
    every worker (which take this ``sys.path``). Taken off, unless the command runs from the root of a source
    checkout (the project's code)."""
    from accel_backends.spawn import forget_working_directory

    started = getattr(sys.modules.get("__main__"), "__spec__", None)
    if started is not None and started.name.startswith("engine.") and \
            Path(__file__).resolve().parents[2] != Path.cwd().resolve():
        forget_working_directory()


def main(recipe, argv: list[str]) -> int:
    """``accel-<trainer> [--preset P] [--config F] [--nproc N] [--resume] [--print-config] key=value...``, and the
    sub-commands ``export``, ``eval`` and the recipe's own. Ctrl-C while it starts (before the workers' own
    handling) ends in one line, and a run directory this start made and nothing was written to is removed."""
    made: list[Path] = []
    try:
        status = _command(recipe, argv, made)
    except KeyboardInterrupt:
        print(f"{recipe.tool}: stopped by SIGINT while starting", file=sys.stderr)
        status = 130
    for directory in made if status else ():
        with contextlib.suppress(OSError):
            directory.rmdir()  # only an empty directory goes: anything written in it stays
    return status


def _command(recipe, argv: list[str], made: list[Path]) -> int:
    import json
    import time

    from .config import require_valid
    from .loop import worker
    from .report import read_metrics
    from .resume import find_run, resumed_config, resumed_from
    from .run_dir import claim, run_dir

    no_imports_from_the_working_directory()
    status = run_subcommand(argv, __package__, {**recipe.commands, **frame_commands(recipe)})
    if status is not None:
        return status
    args = parse_run_args(argv, recipe.tool, recipe.help, recipe.presets, sections=recipe.sections,
                          print_config="check the config and the inputs, print the config resolved and exit",
                          example=recipe.example)
    import accel_backends

    tool = recipe.tool
    try:
        directory, changed = None, {}
        if args.resume:  # the run's record, and only what is given now (refused in one line when it may not change)
            directory = find_run(recipe, args.preset, args.config, args.overrides)
            config, notices, changed = resumed_config(recipe, directory, args.preset, args.config, args.overrides)
            why = "the run's own configuration"
        else:
            config, notices, why = load(recipe, args.preset, args.config, args.overrides)
        for notice in notices if is_rank0() else ():
            print(f"{tool}: notice: {notice}", file=sys.stderr)
        if args.nproc is not None:
            if args.resume and args.nproc != config.nproc:
                changed["nproc"] = (config.nproc, args.nproc)
            config.nproc = args.nproc  # --nproc beats nproc from anywhere else, and config.json records it
        workers = world_size(config, args.nproc)
        require_valid(recipe.check(config, workers))
        if directory is None and not args.print_config:  # a new run: never where one is (before the plan's work)
            directory = run_dir(config, False, recipe.name)
            claim(directory, config.run.overwrite, move=False)
        plan = recipe.plan(config, workers, verbose=is_rank0() and not args.print_config)
        if args.print_config:
            print(f"{tool}: preset {config.preset} ({why})", file=sys.stderr)
            print(json.dumps(recipe.resolved(plan), indent=2))  # stdout stays valid JSON
            return 0
        backend = accel_backends.get_backend()  # an unknown or unusable backend stops us here
        if not args.resume:  # run.overwrite: the earlier run moved aside (rank 0), never deleted
            moved = claim(directory, config.run.overwrite, move=is_rank0())
            if moved:
                print(f"{tool}: notice: {moved}", file=sys.stderr)
        if not directory.exists():
            made.append(directory)
        directory.mkdir(parents=True, exist_ok=True)  # config.json: the loop writes it once the start is settled
    except (ValueError, FileNotFoundError, accel_backends.AccelBackendError) as exc:
        return input_error(tool, exc)
    except OSError as exc:  # a read-only or full output directory, a path under a file: one line, not a traceback
        return input_error(tool, unwritable(directory, exc))
    started = time.perf_counter()
    status = run_workers(tool, worker, config, workers, directory, args.resume, backend=backend,
                         steps=plan.total_steps, args=(recipe.name, config.to_dict(), workers),
                         resumed=resumed_from(directory, changed) if args.resume else "", traceback=args.traceback)
    if status is not None or not is_rank0():
        return status or 0
    line = recipe.done_line(read_metrics(directory / "metrics.jsonl"), time.perf_counter() - started)
    if line:
        print(line)
    print_outputs(directory)
    return 0


def frame_commands(recipe) -> dict[str, Callable[[list[str]], int]]:
    """The frame's sub-commands of every recipe: ``export``, and ``eval`` where the recipe scores (``evaluate``)."""
    from .recipe import Recipe

    commands = {"export": lambda rest: export_main(recipe, rest)}
    if type(recipe).evaluate is not Recipe.evaluate:
        from .evaluate import main as eval_main

        commands["eval"] = lambda rest: eval_main(recipe, rest)
    return commands


def export_main(recipe, argv: list[str]) -> int:
    """``<tool> export RUN_DIR|CHECKPOINT OUT``: the run's config read with the recipe's schema, its model built by
    the recipe (``Recipe.run_model``), the rest shared (``export.py``)."""
    from . import export

    return export.main(argv, export.run_loader(recipe), recipe.tool)


def generic_main(argv: list[str] | None = None) -> int:
    """``accel-train TRAINER ...`` (``python -m engine.train``): the command of any registered trainer, built-in or
    from a plugin; ``accel-train TRAINER --help`` shows that trainer's options."""
    from .registry import RecipeError, get_recipe, recipe_names

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: accel-train TRAINER [--preset NAME] [--config FILE] [--nproc N] [--resume] [--print-config] "
              "[--traceback] [key=value ...]\n       accel-train TRAINER export|eval ...\n\ntrainers: "
              f"{', '.join(recipe_names())}",
              file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        recipe = get_recipe(argv[0])
    except RecipeError as exc:
        return input_error("accel-train", exc)
    return main(recipe, argv[1:])
