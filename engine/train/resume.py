"""``--resume``: a run's record is the truth. The run's own ``config.json`` is read and only the options given now
(``--config``, ``key=value``, ``--nproc``) are applied to it; an option that would change what the checkpoint holds
(the model, LoRA, the trainer) or what the run means (a recipe's ``resume_fixed``: GRPO's group size, loss type,
data) is refused in one line naming the key and its recorded value, before anything is written. The changes that are
safe (``train.steps``...) are said in the start line.

The loop writes ``config.json`` only once the checkpoint loaded (``record``): atomically, with the record it replaces
kept beside it as ``config.previous.json``. A resume that fails leaves the record as it was, so the run still
exports and evaluates."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

RECORD = "config.json"
PREVIOUS = "config.previous.json"
# Where the run is, not what it is: found from these, and then recorded as found.
LOCATION_KEYS = ("run.name", "run.output_dir")


def flatten(data: dict, prefix: str = "") -> dict:
    """``{"train": {"steps": 4}}`` -> ``{"train.steps": 4}`` (a mapping's own keys too: ``engine.lr``)."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _same(key: str, old, new, path_keys) -> bool:
    if key in path_keys and isinstance(old, str) and isinstance(new, str) and not old.startswith("builtin:"):
        return Path(old).resolve() == Path(new).resolve()
    return old == new


def changes(recorded: dict, resumed: dict, path_keys=()) -> dict[str, tuple]:
    """``{key: (recorded value, new value)}`` for every option that differs (the run's location left out)."""
    before, after = flatten(recorded), flatten(resumed)
    return {key: (before.get(key), after.get(key)) for key in sorted(set(before) | set(after))
            if key not in LOCATION_KEYS and not _same(key, before.get(key), after.get(key), path_keys)}


def _fixed_reason(key: str, fixed: dict[str, str]) -> str | None:
    for prefix, why in fixed.items():
        if key == prefix or key.startswith(prefix + "."):
            return why
    return None


def refusal(directory: Path, changed: dict[str, tuple], fixed: dict[str, str]) -> str | None:
    """The one line that refuses a resume changing a fixed option, or None when every change is safe."""
    refused = [(key, old, new, why) for key, (old, new) in changed.items()
               if (why := _fixed_reason(key, fixed)) is not None]
    if not refused:
        return None
    said = "; ".join(f"{key}={_shown(new)} would change {why} (the run recorded {key}={_shown(old)})"
                     for key, old, new, why in refused)
    return (f"--resume {directory}: {said}: resume without it, or start a new run (another run.name) to train "
            "with it")


def _shown(value) -> str:
    return "null" if value is None else json.dumps(value) if not isinstance(value, str) else value


def said(changed: dict[str, tuple]) -> str:
    """The safe changes, for the start line: ``train.steps 4 -> 6``."""
    return ", ".join(f"{key} {_shown(old)} -> {_shown(new)}" for key, (old, new) in changed.items())


def resume_base(recipe, recorded, derived: dict):
    """The recorded config with the engine options the recipe derived (not the user's) taken out, so that the
    resumed config derives them again (the schedule's length after ``train.steps`` changed)."""
    base = copy.deepcopy(recorded)
    for key, value in recipe.derived_engine_options(recorded, derived).items():
        if key in base.engine and base.engine[key] == value:
            del base.engine[key]
    return base


def resumed_config(recipe, directory: Path, preset: str | None, config_file: str | None, overrides: list[str]):
    """``(config, notices, changed)``: the run's recorded config with the options given now applied, or a
    ValueError (one line) naming an option that may not change."""
    from .export import read_run_config
    from .pipeline import load

    if not (directory / RECORD).is_file():
        raise FileNotFoundError(f"--resume: {directory / RECORD} is missing: the run's record is needed to "
                                "continue it")
    recorded = read_run_config(directory, recipe)
    if preset and preset != recorded.preset:
        raise ValueError(f"--resume {directory}: --preset {preset} differs from the run's preset {recorded.preset}: "
                         "resume without --preset (the run keeps its own settings)")
    derived = json.loads((directory / RECORD).read_text()).get("derived") or {}
    base = resume_base(recipe, recorded, derived)
    config, notices, _ = load(recipe, None, config_file, overrides, base=base, remember=False)
    config.run.output_dir, config.run.name = str(directory.parent), directory.name
    changed = changes(base.to_dict(), config.to_dict(), recipe.path_keys)
    line = refusal(directory, changed, recipe.resume_fixed)
    if line:
        raise ValueError(line)
    return config, notices, changed


def record(run_dir: Path, resolved: dict) -> None:
    """Write the run's ``config.json`` atomically (written aside, renamed into place); a different record already
    there is kept as ``config.previous.json``."""
    text = json.dumps(resolved, indent=2)
    path = Path(run_dir) / RECORD
    if path.is_file():
        old = path.read_text()
        if old == text:
            return
        partial = path.with_name(PREVIOUS + ".partial")
        partial.write_text(old)
        os.replace(partial, path.with_name(PREVIOUS))
    partial = path.with_name(RECORD + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def find_run(recipe, preset: str | None, config_file: str | None, overrides: list[str]) -> Path:
    """``--resume``'s run directory (``run.name``, else the newest run of the preset) with a checkpoint in it."""
    from .. import checkpoint
    from .pipeline import load
    from .run_dir import run_dir

    probe, _, _ = load(recipe, preset, config_file, overrides, remember=False)
    directory = run_dir(probe, True, recipe.name)
    latest = checkpoint.latest_complete(directory / "checkpoints")
    if latest is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {directory / 'checkpoints'}")
    checkpoint.refuse_unsafe(latest)  # a planted file is refused here, in one line, before any worker starts
    return directory


def resumed_from(directory: Path, changed: dict) -> str:
    """The start line's word on a resume: the step it continues from and what changed from the run's record."""
    from .. import checkpoint

    latest = checkpoint.latest_complete(directory / "checkpoints")
    line = f"resuming from step {checkpoint.step_of(latest)} ({latest.name}) with the run's recorded config"
    return line + (f", changed: {said(changed)}" if changed else "")
