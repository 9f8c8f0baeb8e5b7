"""The one training loop, run by every rank for every trainer: resume (rank 0 writes the run's ``config.json`` only
once the checkpoint loaded: ``resume.record``), then per step the recipe's step, its
figures reduced over ranks once (sums in one all-reduce, maxima in one more), validation when due
(``validation.should_validate``: every ``run.val_every`` steps and after the last), rank 0's
loggers and progress bar, a checkpoint when due (with retention), and a stop at a safe point (Ctrl-C / SIGTERM:
the step finishes, is saved, and every rank stops at the same step). Only this loop writes a run's outputs."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from .. import checkpoint, runtime
from .config import dist_timeout_s
from .loggers import Loggers
from .progress import progress_bar
from .recipe import Plan, Recipe, StepResult
from .report import plot_curves
from .resume import record
from .steps import advance, finish, save_if_due
from .validation import should_validate


def reduce_step(result: StepResult, device) -> tuple[dict, bool]:
    """The step's metrics row (without ``step``) from every rank's figures, and whether any rank asked to stop."""
    totals = runtime.sum_over_ranks({**result.sums, "stop_requested": float(runtime.stop_requested() > 0)}, device)
    stopping = totals.pop("stop_requested") > 0
    maxima = dict(result.maxima)
    if maxima and dist.is_initialized() and dist.get_world_size() > 1:
        maxima = runtime.max_over_ranks(maxima, device)  # exact, in int64 (no float64 reduction on any device)
    return result.metrics(totals, maxima), stopping


def trained_engines(parts) -> dict:
    """Every engine the run trains, by name, the policy first: ``parts.engines`` when the recipe declares several
    (each is checkpointed and resumed, all in one checkpoint), else ``parts.engine``."""
    return dict(getattr(parts, "engines", None) or {"policy": parts.engine})


def train(recipe: Recipe, plan: Plan, run_dir: Path, resume: bool) -> dict:
    """Run ``plan`` with ``recipe`` on this rank; returns the last step's metrics row."""
    import accel_backends

    backend = accel_backends.get_backend()
    backend.init_distributed(timeout=dist_timeout_s(plan.config))
    return run_parts(recipe, plan, recipe.build(plan, backend), run_dir, resume)


def run_parts(recipe: Recipe, plan: Plan, parts, run_dir: Path, resume: bool) -> dict:
    """The loop over parts already built (the process group exists)."""
    run = plan.config.run
    runtime.stop_at_safe_point(run.save_on_interrupt)
    start = 0
    if resume:
        loaded = checkpoint.load_latest(trained_engines(parts), run_dir / "checkpoints", run.resume_fallback)
        start = checkpoint.step_of(loaded)
    if parts.engine.rank == 0:  # only now: a resume that failed to load leaves the run's record as it was
        record(run_dir, recipe.resolved(plan))
    recipe.ready(parts, start)
    try:
        return _steps(recipe, plan, parts, run_dir, start)
    finally:
        recipe.close(parts)  # whatever ended the loop (a thread the recipe started stops here)


def _steps(recipe: Recipe, plan: Plan, parts, run_dir: Path, start: int) -> dict:
    """Validation before the first step when asked for, the steps from ``start``, the run's end."""
    import accel_backends

    run, backend = plan.config.run, accel_backends.get_backend()
    rank, total = parts.engine.rank, plan.total_steps
    loggers = progress = None
    if rank == 0:
        loggers = Loggers(run.loggers, run_dir, start, recipe.resolved(plan), project=recipe.tool)
        if run.progress:
            progress = progress_bar(total, start, recipe.name)
    last: dict = {}
    if start == 0:
        baseline = recipe.validate(parts, -1, baseline=True)  # the model before any update, when the recipe asks
        if baseline and loggers is not None:
            loggers.write({"step": 0, **baseline})
    for index in range(start, total):
        result = recipe.step(parts, index)
        metrics, stopping = reduce_step(result, backend.metrics_device())
        last = {"step": index + 1, **metrics}
        if should_validate(index, total, run.val_every):  # the frame decides when; the recipe only how
            last.update(recipe.validate(parts, index))
        if loggers is not None:
            loggers.write(last)
            loggers.write_samples(result.samples)
        advance(progress, result.shown(last))
        save_if_due(trained_engines(parts), run_dir, run, index, total, stopping=stopping, rank=rank, progress=progress,
                    tool=recipe.tool)
        if stopping:
            break
    curves = recipe.curves_for(plan.config)
    finish(progress, loggers, lambda: plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png", curves))
    return last


def worker(recipe_name: str, config_dict: dict, world_size: int, run_dir: str, resume: bool) -> dict:
    """What every rank runs: the recipe found again by name (the registry, as in the launching process), the plan
    made again from the config the launcher recorded, then the loop."""
    from .registry import get_recipe

    recipe = get_recipe(recipe_name)
    plan = recipe.plan(recipe.schema.from_dict(config_dict), world_size, verbose=False)
    return train(recipe, plan, Path(run_dir), resume)
