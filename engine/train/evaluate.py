"""``<tool> eval MODEL_DIR|RUN_DIR|CHECKPOINT key=value...``: one evaluation command for every recipe that scores
(``Recipe.evaluate``), with one set of options, outputs and exit statuses; the recipe supplies only what it scores.

The config comes from ``eval_config.py`` (a run: its ``config.json`` under the overrides; a model directory: the
preset, its remembered prompt settings, then ``--config`` and the overrides). Bad input is refused before any
worker starts (exit 2): the recipe's ``eval_problems``, then ``eval_inputs`` reads the data. A run's checkpoint is
exported into the output directory first (LoRA merged, fp32) and removed after, unless the recipe loads checkpoints
itself (``Recipe.eval_exports``). Every worker calls ``evaluate``;
rank 0 writes ``results.json`` (what was evaluated, the recipe's figures and metrics, the world size, the backend,
the time) and ``samples.jsonl`` (every rank's scored records, when there are any) to ``--out``, prints the results'
JSON on stdout (``--json PATH`` also writes it there) and one line on stderr. A failed worker: exit 1, one line, the
tracebacks in the output directory; an interrupt: 128 + the signal.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from .. import checkpoint
from .eval_config import eval_config
from .export import ExportError, export, run_loader
from .run_dir import unwritable
from .workers import parse_nproc
from .workers import world_size as worker_count

HELP = """Evaluate a model on its own: a base model, an exported model, or a run's checkpoint, with the same figures
as validation during training. A run directory is evaluated at its newest complete checkpoint (or --step N) with
the run's own settings under your key=value overrides; a model directory with the library defaults (or --preset)
and the prompt settings it remembers from an export. Writes results.json (and samples.jsonl, every scored record)
to --out and prints the results as JSON."""


def parser(recipe) -> argparse.ArgumentParser:
    """The options every recipe's eval takes."""
    described = HELP + (f"\n\n{recipe.eval_help}" if recipe.eval_help else "")
    command = argparse.ArgumentParser(prog=f"{recipe.tool} eval", description=described,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("source", metavar="MODEL_DIR|RUN_DIR",
                         help="a Hugging Face model directory, a run directory or one of its checkpoints/step_N")
    command.add_argument("--step", type=int, help="a run's checkpoint of this step (default: the newest complete)")
    command.add_argument("--preset", help="for a model directory: the preset whose settings apply (default: the "
                                          "library defaults)")
    command.add_argument("--config", help="a YAML file of sections, applied before the overrides")
    command.add_argument("--nproc", type=parse_nproc, help="worker processes (default: the config's nproc)")
    command.add_argument("--out", help="a new or empty output directory (default: <run>/eval/step_<N> for a run, "
                                       "<run.output_dir>/eval-<model dir name> for a model, with -2, -3... "
                                       "when an earlier evaluation is there: never replaced)")
    command.add_argument("--json", metavar="PATH", help="also write results.json's content to this file")
    command.add_argument("--traceback", action="store_true",
                         help="print the workers' tracebacks when one fails (default: a file in the output directory)")
    command.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. data.val_path=test.jsonl")
    return command


def default_output(config, target: dict) -> Path:
    if "run" in target:
        return Path(target["run"]) / "eval" / f"step_{target['step']:06d}"
    return Path(config.run.output_dir) / f"eval-{Path(target['model']).resolve().name}"


def prepare(recipe, args) -> tuple:
    """``(config, target, world size, inputs, output directory)``, or a ValueError / FileNotFoundError saying
    what is wrong (nothing written)."""
    import accel_backends

    from ..runtime import under_launcher
    from .workers import is_rank0

    config, target, notices = eval_config(recipe, args.source, step=args.step, preset=args.preset,
                                          config_file=args.config, overrides=args.overrides)
    for notice in notices if is_rank0() else ():
        print(f"{recipe.tool} eval: notice: {notice}", file=sys.stderr)
    world_size = worker_count(config, args.nproc)
    accel_backends.get_backend()  # an unknown or unusable backend stops us here
    found = recipe.eval_problems(config, target, world_size)
    if "run" in target and under_launcher():
        found.append(f"under torchrun, evaluate a model directory: {recipe.tool} export the checkpoint first")
    if found:
        raise ExportError("cannot evaluate: " + "; ".join(found))
    if "run" in target:
        checkpoint.checkpoint_meta(target["checkpoint"])  # complete, every file the size its save recorded
    inputs = recipe.eval_inputs(config)  # bad rows fail here
    out = output_directory(Path(args.out) if args.out else default_output(config, target), named=bool(args.out))
    return config, target, world_size, inputs, out


def output_directory(out: Path, named: bool) -> Path:
    """Never an earlier evaluation's directory: the default one with ``-2``, ``-3``... when it holds files; an
    ``--out`` that holds files is refused (the user named it: writing elsewhere would surprise)."""
    from .run_dir import holds_files

    if out.exists() and not out.is_dir():
        raise ExportError(f"output {out} is a file: pass a directory with --out")
    if not holds_files(out):
        return out
    if named:
        raise ExportError(f"--out {out} is not empty (an earlier evaluation's results?): eval never replaces them; "
                          "choose another --out, or leave it out for a new directory of its own")
    number = 2
    while holds_files(out.with_name(f"{out.name}-{number}")) or out.with_name(f"{out.name}-{number}").is_file():
        number += 1
    return out.with_name(f"{out.name}-{number}")


def worker(recipe_name: str, config_dict: dict, weights: str | None) -> dict:
    """Every rank: the recipe found by name, the process group, its ``evaluate``; rank 0 gathers the samples."""
    import torch.distributed as dist

    import accel_backends

    from .config import dist_timeout_s
    from .registry import get_recipe

    recipe = get_recipe(recipe_name)
    config = recipe.schema.from_dict(config_dict)
    backend = accel_backends.get_backend()
    world_size = backend.init_distributed(timeout=dist_timeout_s(config)).world_size
    started = time.perf_counter()
    evaluation = recipe.evaluate(config, weights, backend)
    gathered = [None] * world_size if dist.get_rank() == 0 else None
    dist.gather_object(evaluation.samples, gathered, dst=0)
    samples = [record for part in gathered or () for record in part]
    if samples and all(isinstance(r, dict) and "index" in r for r in samples):
        samples.sort(key=lambda r: r["index"])
    return {"metrics": evaluation.metrics, "results": evaluation.results, "samples": samples,
            "world_size": world_size, "backend": backend.name, "time_s": time.perf_counter() - started}


def main(recipe, argv: list[str]) -> int:
    import accel_backends

    from ..runtime import Interrupted, WorkerFailed, report_early_end, run
    from .run_dir import TRACEBACKS
    from .workers import is_rank0

    args = parser(recipe).parse_intermixed_args(argv)
    tool = f"{recipe.tool} eval"
    try:
        config, target, world_size, inputs, out = prepare(recipe, args)
    except (ValueError, FileNotFoundError, checkpoint.CorruptCheckpoint, accel_backends.AccelBackendError) as exc:
        print(f"{tool}: error: {exc}", file=sys.stderr)
        return 2
    if is_rank0():
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # read-only, full, a file in the way: one line
            print(f"{tool}: error: {unwritable(out, exc, '--out')}", file=sys.stderr)
            return 2
        print(f"{tool}: {target.get('checkpoint') or target['model']}, {world_size} process(es); output {out}",
              file=sys.stderr, flush=True)
    exported = out / "model.tmp"
    try:
        weights = target.get("checkpoint")
        if weights and recipe.eval_exports:  # its weights as a model directory, LoRA merged
            export(weights, exported, run_loader(recipe), dtype="fp32", force=True)
            weights = str(exported)
        outcome = run(worker, world_size, recipe.name, config.to_dict(), weights)
    except (WorkerFailed, Interrupted) as exc:
        return report_early_end(tool, exc, traceback_file=None if args.traceback else out / TRACEBACKS)
    finally:
        shutil.rmtree(exported, ignore_errors=True)
    if not is_rank0():
        return 0
    try:
        return write_results(tool, args, out, target, inputs, outcome)
    except OSError as exc:  # a full disk: one line
        print(f"{tool}: error: {unwritable(out, exc, '--out')}", file=sys.stderr)
        return 1


def write_results(tool: str, args, out: Path, target: dict, inputs: dict, outcome: dict) -> int:
    """Rank 0: ``samples.jsonl`` (when there are samples), ``results.json``, the JSON on stdout, one line."""
    samples = outcome["samples"]
    if samples:
        with (out / "samples.jsonl").open("w") as handle:
            for record in samples:
                handle.write(json.dumps(record) + "\n")
    results = {"source": args.source, **target, **inputs, **outcome["results"], **outcome["metrics"],
               "world_size": outcome["world_size"], "backend": outcome["backend"], "time_s": outcome["time_s"]}
    text = json.dumps(results, indent=2) + "\n"
    (out / "results.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    print(text, end="")
    scores = ", ".join(f"{key} {value:.4f}" for key, value in outcome["metrics"].items()
                       if isinstance(value, float))
    where = f"results: {out / 'results.json'}" + (f", samples: {out / 'samples.jsonl'}" if samples else "")
    print(f"{tool}: {scores}; {where}", file=sys.stderr)
    return 0
