"""Run directories written by the code before the training frame (main at b868d4a, tests/data/run_v1: a GRPO
cpu-demo run of 2 steps with its checkpoint, and an SFT run's config.json and metrics) still work: the GRPO run
resumes to a third step, exports and evaluates; the SFT run's config is read by the SFT recipe as it was written."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_python
from grpo_data import write_jsonl

pytestmark = pytest.mark.slow
OLD = Path(__file__).parent / "data" / "run_v1"
ENV = {"ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1"}
# The overrides the old run was started with (its config.json records them).
OLD_RUN = ["train.prompts_per_step=4", "rollout.n=2", "train.micro_batch_size=8", "run.progress=false"]


@pytest.fixture(scope="module")
def old_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("v1")
    shutil.copytree(OLD / "grpo-cpu-demo", root / "cpu-demo-20261202-040600")  # named as the old code named runs
    return root / "cpu-demo-20261202-040600"


def test_an_old_grpo_run_resumes_where_it_stopped(old_run):
    # Its own launcher (under torchrun a run must be named): --resume finds it by its preset.
    result = run_python(["-m", "engine.rl.algorithms.grpo.cli", "--resume", *OLD_RUN, "train.steps=3",
                         f"run.output_dir={old_run.parent}"], env=ENV, timeout=300)  # --resume finds it by preset
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"run directory {old_run}" in result.stdout
    rows = [json.loads(line) for line in (old_run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert (old_run / "checkpoints" / "step_000003" / "engine_meta.json").is_file()


def test_an_old_grpo_run_exports_and_evaluates(old_run, tmp_path, capsys, monkeypatch):
    from engine.rl.algorithms.grpo.cli import main  # one rank, in this process

    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    out = tmp_path / "exported"
    assert main(["export", str(old_run / "checkpoints" / "step_000002"), str(out)]) == 0, capsys.readouterr().err
    assert (out / "model.safetensors").is_file() and json.loads((out / "config.json").read_text())["vocab_size"] > 0
    val = write_jsonl(tmp_path / "val.jsonl", [{"prompt": "abc", "answer": "cba"}, {"prompt": "xyz", "answer": "zyx"}])
    evaluated = main(["eval", str(old_run), "--step", "2", "--nproc", "1", f"data.val_path={val}",
                      "data.reward=engine.grpo.tasks:echo_reward", f"--out={tmp_path / 'eval'}"])
    assert evaluated == 0, capsys.readouterr().err[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["step"] == 2 and results["prompts"] == 2 and 0.0 <= results["val/reward_mean"] <= 1.0


def test_an_old_sft_run_config_reads_as_it_was_written():
    from engine.train.registry import get_recipe

    recipe = get_recipe("sft")
    written = json.loads((OLD / "sft-config.json").read_text())
    config = recipe.schema.from_dict(written)
    as_json = json.loads(json.dumps(config.to_dict()))
    assert as_json["run"].pop("overwrite") is False  # a key added since (issue 45), at its default
    assert as_json == {k: v for k, v in written.items() if k != "derived"}  # every key, every value
    assert config.data.max_length == 64 and config.preset == "cpu-demo"
    assert recipe.run_model(config).model_path == written["model"]["path"]
