"""The frame's checkpoint of every trained engine (engine/checkpoint/engine_set.py), 2 real gloo ranks: a run of a
two-engine recipe killed (SIGKILL) after the policy's save and before the critic's resumes from the previous
complete checkpoint, both engines from the same step, to the figures the killed run had computed."""

import json
from pathlib import Path

import pytest
from conftest import REPO, run_python

from engine import checkpoint

HERE = Path(__file__).resolve().parent


def _pair(root, *args, **env):
    return run_python(["-m", "engine.train", "pair", "train.steps=3", "run.save_every=1", "run.progress=false",
                       "run.keep_checkpoints=5", f"run.output_dir={root}", "run.name=pair", *args],
                      env={"PYTHONPATH": f"{HERE}:{REPO / 'tests'}", "ACCEL_BACKENDS_PLUGINS": "two_engines",
                           "ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1", **env}, timeout=300)


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_kill_between_the_two_engines_saves_resumes_from_the_previous_complete_checkpoint(tmp_path, no_orphans):
    killed = _pair(tmp_path, PAIR_KILL="0:3")
    assert killed.returncode != 0 and "killed by SIGKILL" in killed.stderr + killed.stdout, killed.stderr[-2000:]
    run, checkpoints = tmp_path / "pair", tmp_path / "pair" / "checkpoints"
    half = checkpoints / "step_000003.partial"
    assert (half / "policy" / checkpoint.META_FILE).is_file() and not (half / "critic").exists()
    assert not (half / checkpoint.META_FILE).exists()  # never complete: it is not a checkpoint
    assert [p.name for p in checkpoint.complete_checkpoints(checkpoints)] == ["step_000002", "step_000001"]
    step = checkpoint.latest_complete(checkpoints)
    assert sorted(checkpoint.engine_set.parts_of(step)) == ["critic", "policy"]
    assert checkpoint.policy_checkpoint(step) == step / "policy"  # what export writes
    before = _rows(run)
    assert [row["step"] for row in before] == [1, 2, 3]

    resumed = _pair(tmp_path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 2" in resumed.stdout + resumed.stderr
    after = _rows(run)
    assert [row["step"] for row in after] == [1, 2, 3]  # step 3's row is the resumed run's now
    again = after[-1]
    for key in ("loss", "critic_loss"):  # both engines back at step 2's state (weights, optimizer, RNG)
        assert again[key] == pytest.approx(before[2][key], rel=1e-6), key
    assert [p.name for p in checkpoint.complete_checkpoints(checkpoints)][0] == "step_000003"
    assert not (checkpoints / "step_000003.partial").exists()
