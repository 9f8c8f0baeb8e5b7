"""How every trainer's ``eval`` makes its config, once: a run (or one of its checkpoints) is evaluated with the
run's own ``config.json``; a model directory with a preset (the library defaults unless ``--preset`` names one)
and ``model.path`` set to it, whose remembered prompt settings then apply (``prompting.py``); then ``--config`` and
the overrides, then the recipe's migrations, as training does."""

from __future__ import annotations

from pathlib import Path

from .. import checkpoint
from ..checkpoint import META_FILE
from .config import DEFAULT_PRESET, build_config
from .export import ExportError, locate, read_run_config


def is_run(source: Path) -> bool:
    """A run directory or one of its checkpoints (else: a model directory)."""
    return ((source / "config.json").is_file() and (source / "checkpoints").is_dir()) \
        or (source / ".metadata").exists() or (source / META_FILE).exists() or source.name.startswith("step_")


def eval_config(recipe, source, *, step: int | None = None, preset: str | None = None,
                config_file: str | None = None, overrides=()) -> tuple[object, dict, list[str]]:
    """``(config, target, notices)``: ``target`` says what is evaluated (``run``, ``checkpoint``, ``step``, or
    ``model``) for the results."""
    from .pipeline import load

    source = Path(source)
    if is_run(source):
        if preset:
            raise ExportError("--preset is for a model directory: a run is evaluated with its own config.json")
        run_dir, found = locate(source, step)
        base = read_run_config(run_dir, recipe)
        target = {"run": str(run_dir), "checkpoint": str(found), "step": checkpoint.step_of(found)}
    else:
        if step is not None:
            raise ExportError(f"--step chooses a run's checkpoint; {source} is not a run directory")
        base = build_config(recipe.schema, recipe.presets, preset or DEFAULT_PRESET, None, [])
        base.model.path = str(source)
        target = {"model": str(source)}
    # A model directory's remembered prompt settings (an export's) apply; a run has its own record.
    config, notices, _ = load(recipe, None, config_file, list(overrides), base=base, remember="model" in target)
    return config, target, notices
