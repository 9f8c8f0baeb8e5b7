"""The shared run layer (engine/runs/): a user's WANDB_DIR wins over the run directory; the progress bar takes no
multiprocessing lock (whose semaphore leaked at the end of every run); one config pipeline for any schema."""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from engine.runs.config import build_config


def _fake_wandb(monkeypatch, seen):
    module = types.ModuleType("wandb")
    module.Settings = lambda **kwargs: kwargs
    module.init = lambda **kwargs: seen.update(kwargs) or types.SimpleNamespace(log=None, finish=None)
    monkeypatch.setitem(sys.modules, "wandb", module)


@pytest.mark.parametrize("user_dir", [None, "/somewhere/wandb-files"])
def test_wandb_dir_of_the_user_wins(monkeypatch, tmp_path, user_dir):
    from engine.runs.loggers import WandbLogger

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
    import threading

    from tqdm import tqdm

    from engine.runs.progress import progress_bar

    bar = progress_bar(3, 0, "x")
    try:
        assert isinstance(tqdm.get_lock(), type(threading.RLock()))
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
