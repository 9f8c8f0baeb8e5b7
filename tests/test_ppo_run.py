"""accel-ppo end to end, 2 CPU processes: the critic trains alone during its warmup, then both engines each with
its own optimizer; a step's checkpoint holds both; a resume from the middle checkpoint continues both engines to
the figures of the uninterrupted run; export writes the policy."""

import json
import shutil

import pytest
from conftest import REPO, run_python

pytestmark = pytest.mark.slow

SMALL = ["train.steps=4", "run.save_every=2", "train.prompts_per_step=4", "rollout.n=2", "run.progress=false",
         "critic.warmup_steps=1"]


def ppo(root, *args):
    env = {"PYTHONPATH": str(REPO / "tests"), "ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1"}
    return run_python(["-m", "engine.recipes.ppo.cli", *SMALL, f"run.output_dir={root}", *args], env=env,
                      timeout=400)


def rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_ppo_trains_a_critic_checkpoints_both_engines_and_resumes_them(tmp_path):
    result = ppo(tmp_path, "run.name=straight")
    assert result.returncode == 0, result.stderr[-3000:]
    straight = tmp_path / "straight"
    figures = rows(straight)
    assert [row["updates"] for row in figures] == [0.0, 1.0, 1.0, 1.0]  # critic.warmup_steps=1: the policy waits
    for row in figures:
        assert row["critic/grad_norm"] > 0 and row["critic/lr"] == pytest.approx(1e-3)
        assert {"critic/vf_loss", "critic/vf_clip_frac", "critic/values_mean", "critic/returns_mean"} <= set(row)
    step = straight / "checkpoints" / "step_000004"
    assert sorted(p.name for p in step.iterdir()) == ["critic", "engine_meta.json", "policy"]

    shutil.copytree(straight, tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000004")
    result = ppo(tmp_path, "run.name=resumed", "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    for got, want in zip(rows(tmp_path / "resumed")[2:], figures[2:], strict=True):
        for key in ("loss", "critic/vf_loss", "critic/values_mean", "reward_mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key

    exported = run_python(["-m", "engine.recipes.ppo.cli", "export", str(straight), str(tmp_path / "hf")],
                          env={"ACCEL_BACKEND": "cpu"}, timeout=200)
    assert exported.returncode == 0, exported.stderr[-2000:]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]  # the policy, not the critic
