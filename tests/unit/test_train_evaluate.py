"""engine/train/evaluate.py: one eval command for every recipe that scores. A plugin's recipe supplies only what it
scores (``eval_problems``, ``eval_inputs``, ``evaluate``); the frame gives it the options, the outputs
(results.json, samples.jsonl sorted by index, the JSON on stdout, one line on stderr) and the exit statuses (2 for
bad input before any worker, 1 for a failed worker with the tracebacks in a file). One process, in this one."""

import json

import pytest

PLUGIN = '''
from __future__ import annotations

import dataclasses
from typing import Any

import accel_backends
from engine.train import ConfigRoot, Evaluation, ModelConfig, Recipe, RunConfig
from engine.train import hookspecs  # noqa: F401


@dataclasses.dataclass
class Data:
    val_path: str | None = None
    explode: bool = False


@dataclasses.dataclass
class ScoreConfig(ConfigRoot):
    preset: str = "default"
    nproc: int | str = "auto"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: Data = dataclasses.field(default_factory=Data)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)
    trainer: str = "score"


class ScoreRecipe(Recipe):
    name, tool, schema, presets = "score", "accel-train score", ScoreConfig, {"default": {}, "cpu-demo": {}}
    eval_help = "Scores lines."

    def eval_problems(self, config, target, world_size):
        return [] if config.data.val_path else ["no validation data: give data.val_path=FILE"]

    def eval_inputs(self, config):
        with open(config.data.val_path) as handle:
            return {"items": len(handle.read().split())}

    def evaluate(self, config, model_dir, backend):
        if config.data.explode:
            raise RuntimeError("the scorer broke\\non two lines")
        import torch.distributed as dist

        words = open(config.data.val_path).read().split()
        samples = [{"index": i, "word": w, "rank": dist.get_rank()} for i, w in reversed(list(enumerate(words)))]
        return Evaluation(metrics={"val/score": 0.5, "val/words": float(len(words))}, samples=samples,
                          results={"model_dir": model_dir})


class Untested(Recipe):
    name = "untested"


@accel_backends.hookimpl
def register_recipes(register):
    register("score", ScoreRecipe)
'''


@pytest.fixture
def scorer(tmp_path, monkeypatch):
    import accel_backends
    from engine.train.registry import get_recipe

    (tmp_path / "score_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ACCEL_BACKENDS_PLUGINS", "score_plugin")
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    accel_backends.reset_registry()
    (tmp_path / "model").mkdir()
    (tmp_path / "val.txt").write_text("alpha beta gamma\n")
    return get_recipe("score"), tmp_path


def test_a_plugins_eval_gets_the_frames_options_outputs_and_statuses(scorer, capsys):
    from engine.train.cli import main

    recipe, root = scorer
    out = root / "out"
    code = main(recipe, ["eval", str(root / "model"), "--nproc", "1", f"--out={out}", f"data.val_path={root}/val.txt",
                         "--json", str(root / "copy.json")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    results = json.loads((out / "results.json").read_text())
    assert json.loads(captured.out) == results == json.loads((root / "copy.json").read_text())
    assert results["model"] == str(root / "model") and results["items"] == 3 and results["model_dir"] is None
    assert (results["val/score"], results["val/words"], results["world_size"]) == (0.5, 3.0, 1)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["index"] for s in samples] == [0, 1, 2] and samples[0]["word"] == "alpha"  # sorted by index
    last = captured.err.strip().splitlines()[-1]
    assert last == (f"accel-train score eval: val/score 0.5000, val/words 3.0000; results: {out / 'results.json'}, "
                    f"samples: {out / 'samples.jsonl'}")

    # Bad input: one line, exit 2, nothing written.
    assert main(recipe, ["eval", str(root / "model"), "--nproc", "1", f"--out={root / 'none'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "accel-train score eval: error: cannot evaluate: no validation data: give data.val_path=FILE"
    assert not (root / "none").exists()

    # A failing worker: exit 1, one uncut line naming the rank and the cause; the traceback in the output directory.
    # (in a new directory: eval never replaces an earlier evaluation's, issue 45)
    failed = root / "failed"
    assert main(recipe, ["eval", str(root / "model"), "--nproc", "1", f"--out={failed}",
                         f"data.val_path={root}/val.txt", "data.explode=true"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"accel-train score eval: error: rank 0 failed: RuntimeError: the scorer broke on two lines "
                    f"(tracebacks: {failed / 'tracebacks.txt'}; --traceback prints them)")
    assert "Traceback (most recent call last)" in (failed / "tracebacks.txt").read_text()


def test_eval_is_offered_to_the_recipes_that_score(scorer):
    import score_plugin

    from engine.train.cli import frame_commands
    from engine.train.registry import get_recipe

    for name in ("grpo", "sft", "score"):
        assert set(frame_commands(get_recipe(name))) == {"export", "eval"}, name
    assert set(frame_commands(score_plugin.Untested())) == {"export"}


def test_a_model_directorys_evaluation_goes_beside_the_runs_and_a_file_is_no_output(tmp_path):
    """Where eval writes when no --out is given for a model directory (not a run's checkpoint), and the one-line
    refusal of an --out that names a file."""
    from types import SimpleNamespace

    from engine.train.evaluate import ExportError, default_output, output_directory

    config = SimpleNamespace(run=SimpleNamespace(output_dir=str(tmp_path / "runs")))
    assert default_output(config, {"model": str(tmp_path / "models" / "qwen-tuned")}) == \
        tmp_path / "runs" / "eval-qwen-tuned"
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(ExportError, match=r"results.json is a file: pass a directory with --out"):
        output_directory(tmp_path / "results.json", named=True)
