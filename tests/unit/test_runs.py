"""The shared run layer (engine/train/): a user's WANDB_DIR wins over the run directory; the progress bar takes no
multiprocessing lock (whose semaphore leaked at the end of every run); one config pipeline for any schema."""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from engine.train.config import build_config


def _fake_wandb(monkeypatch, seen):
    module = types.ModuleType("wandb")
    module.Settings = lambda **kwargs: kwargs
    module.init = lambda **kwargs: seen.update(kwargs) or types.SimpleNamespace(log=None, finish=None)
    monkeypatch.setitem(sys.modules, "wandb", module)


@pytest.mark.parametrize("user_dir", [None, "/somewhere/wandb-files"])
def test_wandb_dir_of_the_user_wins(monkeypatch, tmp_path, user_dir):
    from engine.train.loggers import WandbLogger

    seen = {}
    _fake_wandb(monkeypatch, seen)
    if user_dir:
        monkeypatch.setenv("WANDB_DIR", user_dir)
    else:
        monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    WandbLogger(tmp_path / "run-1", {"a": 1}, project="accel-sft")
    assert seen["dir"] == (user_dir or str(tmp_path / "run-1"))
    assert seen["project"] == "accel-sft" and seen["name"] == "run-1"


def test_progress_bar_uses_a_thread_lock():
    import io
    import threading

    from tqdm import tqdm

    from engine.train.progress import progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    bar = progress_bar(3, 0, "x", stream=Terminal())  # on a terminal: tqdm's bar
    try:
        assert isinstance(bar, tqdm) and isinstance(tqdm.get_lock(), type(threading.RLock()))
    finally:
        bar.close()


@dataclasses.dataclass
class _Section:
    size: int = 1
    name: str | None = None


@dataclasses.dataclass
class _Schema:
    preset: str = "small"
    part: _Section = dataclasses.field(default_factory=_Section)


def test_the_pipeline_takes_any_trainers_schema(tmp_path):
    presets = {"small": {"part": {"size": 2}}, "big": {"part": {"size": 8}}}
    config_file = tmp_path / "c.yaml"
    config_file.write_text("part:\n  name: x\n")
    config = build_config(_Schema, presets, "big", str(config_file), ["part.size=1.0e1"], default_preset="small")
    assert config == _Schema(preset="big", part=_Section(size=10, name="x"))
    with pytest.raises(ValueError, match=r"unknown option 'part.sise' \(did you mean part\.size\?\)"):
        build_config(_Schema, presets, None, None, ["part.sise=3"], default_preset="small")
    with pytest.raises(ValueError, match="unknown preset 'huge': choose one of small, big"):
        build_config(_Schema, presets, "huge", None, [])


def test_each_trainer_reads_its_own_run_config_and_names_the_other_tool(tmp_path):
    """engine/train/export.py: read_run_config, one reader behind every trainer's export and eval (round trip with
    the shared ConfigRoot.to_dict/from_dict; a run of another trainer named with the tool to use; a run from before
    config.json named its trainer is GRPO's)."""
    import json

    from engine.train.export import ExportError, read_run_config
    from engine.train.registry import get_recipe

    grpo, sft = get_recipe("grpo"), get_recipe("sft")
    runs = {}
    for recipe in (grpo, sft):
        config = recipe.schema()
        config.train.seed = 7
        runs[recipe.name] = tmp_path / recipe.name
        runs[recipe.name].mkdir()
        (runs[recipe.name] / "config.json").write_text(json.dumps({**config.to_dict(), "derived": {"world_size": 2}}))
    seeded = grpo.schema.from_dict(grpo.schema().to_dict() | {"train": {"seed": 7}})
    assert read_run_config(runs["grpo"], grpo) == seeded
    assert read_run_config(runs["sft"], sft).train.seed == 7
    with pytest.raises(ExportError, match="is an accel-sft run: use accel-sft export"):
        read_run_config(runs["sft"], grpo)
    with pytest.raises(ExportError, match="is an accel-grpo run: use accel-grpo export"):
        read_run_config(runs["grpo"], sft)
    legacy = {k: v for k, v in grpo.schema().to_dict().items() if k != "trainer"}
    (runs["grpo"] / "config.json").write_text(json.dumps(legacy))
    assert read_run_config(runs["grpo"], grpo) == grpo.schema()
    (runs["grpo"] / "config.json").write_text('{"model": {"nope": 1}}')
    with pytest.raises(ExportError, match="is not a readable accel-grpo config: unknown option 'model.nope'"):
        read_run_config(runs["grpo"], grpo)


def test_invalid_configuration_is_one_line_for_one_problem_and_a_list_for_several():
    from engine.train.config import require_valid

    require_valid([])
    with pytest.raises(ValueError, match=r"^invalid configuration: a$"):
        require_valid(["a"])
    with pytest.raises(ValueError, match=r"^invalid configuration:\n  - a\n  - b$"):
        require_valid(["a", "b"])
