"""``<tool> eval RUN_DIR|CHECKPOINT|MODEL_DIR key=value...`` for the trainers on preference pairs: the loss and
metrics of a model over held-out pairs, the same figures as a run's ``val/*``.

The pairs are ``data.val_path``, else the run's own held-out share (its ``data.val_path`` or ``data.val_fraction``,
or the demo task's). A run is evaluated at its newest complete checkpoint (or ``--step N``), written first as a
model directory (LoRA merged) by the frame's export; a model directory as it is. The recipe scores it
(``evaluate(config, model_dir, backend) -> figures``; ``eval_pairs(config)``: how many pairs, bad rows failing
here; ``eval_problems(config, target, world_size)``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ...train.config import dist_timeout_s
from ...train.eval_config import eval_config
from ...train.export import ExportError, export
from ...train.workers import parse_nproc, world_size


def configure(recipe, source: str, step: int | None, overrides: list[str]):
    """``(config, target)`` for a run, a checkpoint or a model directory, overrides applied."""
    config, target, _ = eval_config(recipe, source, step=step, overrides=overrides)
    d = config.data
    if d.val_path or "model" in target:
        d.val_fraction = 0.0
    if "model" in target and not d.val_path:
        raise ExportError("evaluating a model directory needs data.val_path=FILE")
    if "run" in target and d.path and not (d.val_path or d.val_fraction):  # the demo task holds one out
        raise ExportError(f"run {target['run']} has no validation set: pass data.val_path=FILE")
    return config, target


def worker(tool: str, config_dict: dict, model_dir: str | None) -> dict:
    import accel_backends

    from ...train.registry import get_recipe

    recipe = get_recipe(tool)
    config = recipe.schema.from_dict(config_dict)
    backend = accel_backends.get_backend()
    backend.init_distributed(timeout=dist_timeout_s(config))
    return recipe.evaluate(config, model_dir, backend)


HELP = """The loss and metrics of a model on held-out preference pairs: the same figures as a run's val/* metrics.

The pairs are data.val_path, else the run's own. A run is evaluated at its newest complete checkpoint (or --step
N); a model directory as it is, with the library defaults."""


def main(recipe, argv: list[str]) -> int:
    tool = recipe.tool
    parser = argparse.ArgumentParser(prog=f"{tool} eval", description=HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="RUN_DIR|CHECKPOINT|MODEL_DIR")
    parser.add_argument("--step", type=int, help="the checkpoint of this step (with a run directory)")
    parser.add_argument("--nproc", type=parse_nproc, help="worker processes (default: the config's)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to this file")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(argv)
    from ...runtime import Interrupted, WorkerFailed, run

    with tempfile.TemporaryDirectory(prefix="eval-") as scratch:
        try:
            config, target = configure(recipe, args.source, args.step, args.overrides)
            workers = world_size(config, args.nproc)
            problems = recipe.check(config, workers)
            if hasattr(recipe, "eval_problems"):
                problems += recipe.eval_problems(config, target, workers)
            if problems:
                raise ValueError("invalid configuration: " + "; ".join(problems))
            pairs = recipe.eval_pairs(config)  # bad rows fail here, before any worker
            model_dir = None
            if "checkpoint" in target:
                model_dir = str(Path(scratch) / "model")
                export(target["checkpoint"], model_dir, lambda run_dir: recipe.run_model(config), dtype="fp32")
        except (ValueError, FileNotFoundError) as exc:
            print(f"{tool} eval: error: {exc}", file=sys.stderr)
            return 2
        try:
            figures = run(worker, workers, recipe.name, config.to_dict(), model_dir)  # rank 0's
        except (WorkerFailed, Interrupted) as exc:
            print(f"{tool} eval: error: {exc}", file=sys.stderr)
            return 1
    text = json.dumps({"source": args.source, **{k: v for k, v in target.items() if k != "run"}, "pairs": pairs,
                       **figures}, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0
