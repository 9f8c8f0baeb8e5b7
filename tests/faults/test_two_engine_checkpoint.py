"""The frame's checkpoint of every trained engine (engine/checkpoint/engine_set.py), 2 real gloo ranks: a PPO run
killed (SIGKILL) after the policy's save and before the critic's resumes from the previous complete checkpoint,
both engines from the same step, to the figures the killed run had computed; the critic trains alone during its
warmup, then both, each with its own optimizer (and micro-batches: the resumed run's critic.micro_batch_size=1
trains the critic as the killed run's one micro-batch did); export writes the policy."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO, run_python
from pool_commands import run_command

from engine import checkpoint
from engine.rl.algorithms.ppo.cli import main

HERE = Path(__file__).resolve().parent
SMALL = ["train.steps=3", "run.save_every=1", "run.keep_checkpoints=5", "train.prompts_per_step=4", "rollout.n=2",
         "run.progress=false", "run.name=ppo"]
ENV = {"PYTHONPATH": str(REPO / "tests"), "ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1"}


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_ppo_run_killed_between_its_two_saves_resumes_from_the_previous_complete_checkpoint(
        tmp_path, warm_pool, no_orphans, capsys, monkeypatch):
    # The policy trains from step 2 on (critic.warmup_steps=1): its global step is 2 at step 3's save.
    killed = run_python([str(HERE / "ppo_faults.py"), "0:2", *SMALL, f"run.output_dir={tmp_path}"], env=ENV,
                        timeout=400)
    assert killed.returncode != 0 and "killed by SIGKILL" in killed.stderr + killed.stdout, killed.stderr[-2000:]
    run, checkpoints = tmp_path / "ppo", tmp_path / "ppo" / "checkpoints"
    half = checkpoints / "step_000003.partial"
    assert (half / "policy" / checkpoint.META_FILE).is_file() and not (half / "critic").exists()
    assert not (half / checkpoint.META_FILE).exists()  # never complete: it is not a checkpoint
    assert [p.name for p in checkpoint.complete_checkpoints(checkpoints)] == ["step_000002", "step_000001"]
    step = checkpoint.latest_complete(checkpoints)
    assert sorted(checkpoint.engine_set.parts_of(step)) == ["critic", "policy"]
    assert checkpoint.policy_checkpoint(step) == step / "policy"  # what export writes
    before = _rows(run)
    assert [row["step"] for row in before] == [1, 2, 3]

    # Saving changes nothing (issue 45): the same run saving no checkpoint until its end trains to the same figures
    # at every step, though the killed run saved the policy at step 1, during the critic's warm-up, before its
    # optimizer stepped (its first update, at step 2, then counted as its second: step 3 differed). This run and the
    # resumed one are on the warm rank pool's 2 ranks (torchrun's path): only the killed run needs its own launcher.
    unsaved = run_command("ppo", [*SMALL, "run.save_every=0", "run.name=ppo-unsaved", f"run.output_dir={tmp_path}"],
                          timeout=400)
    assert unsaved.returncode == 0, unsaved.stderr[-3000:]
    figures = ("loss", "pg_loss", "grad_norm", "reward_mean", "critic/vf_loss", "critic/grad_norm")
    plain = _rows(tmp_path / "ppo-unsaved")
    assert [[row[key] for key in figures] for row in plain] == [[row[key] for key in figures] for row in before]

    # The resumed run splits the critic's passes into micro-batches of one sequence (critic.micro_batch_size): its
    # values, loss and gradient are the killed run's, which had one micro-batch per rank (train.micro_batch_size).
    resumed = run_command("ppo", [*SMALL, f"run.output_dir={tmp_path}", "--resume", "critic.micro_batch_size=1"],
                          timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 2" in resumed.stdout + resumed.stderr
    after = _rows(run)
    assert [row["step"] for row in after] == [1, 2, 3]  # step 3's row is the resumed run's now
    for key in ("loss", "reward_mean", "critic/vf_loss", "critic/values_mean"):  # both engines back at step 2
        assert after[-1][key] == pytest.approx(before[2][key], rel=1e-5, abs=1e-7), key
    assert after[-1]["critic/grad_norm"] == pytest.approx(before[2]["critic/grad_norm"], rel=1e-4)
    assert before[2]["critic/micro_batches"] == 1 and after[-1]["critic/micro_batches"] == 4  # 4 sequences a rank
    assert [p.name for p in checkpoint.complete_checkpoints(checkpoints)][0] == "step_000003"
    assert not (checkpoints / "step_000003.partial").exists()
    assert [row["updates"] for row in after] == [0.0, 1.0, 1.0]  # critic.warmup_steps=1: the policy waits a step
    for row in after:  # the critic trains every step, with its own optimizer and learning rate
        assert row["critic/grad_norm"] > 0 and row["critic/lr"] == pytest.approx(1e-3)
        assert {"critic/vf_loss", "critic/vf_clip_frac", "critic/values_mean", "critic/returns_mean"} <= set(row)

    monkeypatch.setenv("ACCEL_BACKEND", "cpu")  # export and the refused resume: in this process
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0, capsys.readouterr().err[-2000:]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]  # the policy, not the critic

    # The planted pickle as the critic's .metadata (at its recorded size) of a copy of the run: --resume
    # refuses it in one line naming the file, before any worker, and nothing runs.
    from planted_pickles import plant

    planted, marker = tmp_path / "planted", tmp_path / "marker"
    shutil.copytree(run, planted)
    critic_metadata = planted / "checkpoints" / "step_000003" / "critic" / ".metadata"
    plant(critic_metadata, marker)
    refused = main([*SMALL[:-1], "run.name=planted", f"run.output_dir={tmp_path}", "--resume"])
    err = capsys.readouterr().err.strip()
    assert refused != 0 and not marker.exists(), err[-2000:]
    assert "\n" not in err and f"{critic_metadata} was refused: it asks to load" in err, err
