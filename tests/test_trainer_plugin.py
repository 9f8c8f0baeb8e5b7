"""A third-party trainer and RL algorithm from their own package (plugins/accel-example-trainer, pip-installed into a
folder): found through its ``accel_backends`` entry point, run by the frame's command on 2 real gloo ranks with
checkpoints, and resumed from its middle checkpoint to the same figures. docs/adding-a-trainer.md is built on it."""

import json
import shutil

import pytest
from conftest import run_python

pytestmark = pytest.mark.slow


def _train(site, root, *args):
    return run_python(["-m", "engine.train", "count", "--preset", "cpu-demo", "train.steps=4", "run.save_every=2",
                       "run.progress=false", f"run.output_dir={root}", *args],
                      env={"PYTHONPATH": site, "ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1"}, timeout=300)


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_the_entry_point_registers_the_trainer(plugin_site):
    listed = run_python(["-m", "engine.train", "--help"], env={"PYTHONPATH": plugin_site}, check=True)
    assert "trainers: count, distill, dpo, grpo, ppo, rloo, rm, sft" in listed.stdout
    rloo = run_python(["-m", "engine.train", "rloo", "--print-config", "--preset", "cpu-demo"],
                      env={"PYTHONPATH": plugin_site}, check=True)  # an algorithm, one module: the one RL recipe's
    assert json.loads(rloo.stdout)["algorithm"]["kl_coef"] == 0.01 and json.loads(rloo.stdout)["trainer"] == "rloo"
    printed = run_python(["-m", "engine.train", "count", "--print-config", "data.batch_size=4"],
                         env={"PYTHONPATH": plugin_site}, check=True)
    config = json.loads(printed.stdout)
    assert config["trainer"] == "count" and config["derived"] == {"world_size": 2, "sequences_per_rank": 2}
    assert "accel-train count: preset cpu-demo (the demo: no --preset, no model.path and no data.path" in printed.stderr
    assert config["run"]["save_on_interrupt"] is True  # the frame's run settings, shared


def test_the_frame_runs_checkpoints_and_resumes_a_plugin_trainer(plugin_site, tmp_path):
    result = _train(plugin_site, tmp_path, "run.name=straight")
    assert result.returncode == 0, result.stderr[-3000:]
    straight = tmp_path / "straight"
    rows = _rows(straight)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["sequences"] == 8.0 for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    assert (straight / "curves.png").is_file()

    shutil.copytree(straight, tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000004")
    result = _train(plugin_site, tmp_path, "run.name=resumed", "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = _rows(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for got, want in zip(resumed[2:], rows[2:], strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
