"""``accel-grpo`` under faults: Ctrl-C / SIGTERM during rollout and update, a rank killed while saving, a reward
function raising on one rank. Nothing is lost (the last complete checkpoint stays loadable, resuming continues like
an uninterrupted run) and nothing hangs (bounded exit, exit status, no process left behind)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pool_commands import run_command

from engine.checkpoint import latest_complete

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TINY = ["train.steps=3", "train.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8",
        "train.micro_batch_size=4", "algorithm.kl_coef=0", "run.progress=false", "run.save_every=1",
        "engine.dist_timeout_s=60"]


def start(tmp_path, fault, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]), "OMP_NUM_THREADS": "1",
           "ACCEL_BACKEND": "cpu", "FAULT_MARK": str(tmp_path / "fault-reached")}
    return subprocess.Popen([sys.executable, str(HERE / "grpo_faults.py"), fault, *TINY,
                             f"run.output_dir={tmp_path / 'runs'}", *args],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process, timeout=240):
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"accel-grpo did not exit within {timeout} s:\n{err[-3000:]}") from None
    return process.returncode, out + err


def signal_when_reached(tmp_path, process, signum, timeout=180):
    mark = tmp_path / "fault-reached"
    deadline = time.monotonic() + timeout
    while not mark.exists():
        assert process.poll() is None, f"accel-grpo exited before the fault point:\n{finish(process)[1][-3000:]}"
        assert time.monotonic() < deadline, "the fault point was never reached"
        time.sleep(0.1)
    process.send_signal(signum)
    Path(os.environ["FAULT_STAMP"]).write_text(repr(time.time()))  # time to a clean exit counts from the signal


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_ctrl_c_saves_the_step_and_a_rank_killed_while_saving_resumes_like_an_uninterrupted_run(tmp_path, warm_pool,
                                                                                                 no_orphans):
    checkpoints_a = tmp_path / "runs" / "a" / "checkpoints"
    # Run a: Ctrl-C during step 2's rollout with save_on_interrupt: step 2 finishes, is saved, exit 130.
    no_orphans.start()
    a = start(tmp_path, "pause-rollout:0:2", "run.name=a", "run.save_on_interrupt=true")
    signal_when_reached(tmp_path, a, signal.SIGINT)
    code, output = finish(a)
    no_orphans.stop("SIGINT during rollout (save_on_interrupt)")
    assert code == 130, output
    assert "--resume run.name=a" in output and "step_000002" in output, output
    assert latest_complete(checkpoints_a).name == "step_000002"
    assert [row["step"] for row in metrics(checkpoints_a.parent)] == [1, 2]

    # Run b: rank 1 is SIGKILLed while writing step 2's checkpoint: exit 1 naming it; step 1 stays the latest.
    checkpoints_b = tmp_path / "runs" / "b" / "checkpoints"
    no_orphans.start()
    code, output = finish(start(tmp_path, "kill-save:1:2", "run.name=b"))
    no_orphans.stop("rank 1 SIGKILL during a checkpoint save")
    assert code == 1, output
    assert "rank 1 failed: killed by SIGKILL" in output, output
    assert "--resume run.name=b" in output, output
    assert latest_complete(checkpoints_b).name == "step_000001"
    assert not (checkpoints_b / "step_000002").exists()

    # Run b resumes from step 1 and runs to the end, on the warm rank pool's 2 ranks (no fault: no own launcher).
    resumed = run_command("grpo", [*TINY, f"run.output_dir={tmp_path / 'runs'}", "run.name=b", "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a_rows, b_rows = metrics(checkpoints_a.parent), metrics(checkpoints_b.parent)
    assert [row["step"] for row in b_rows] == [1, 2, 3]
    # Run a took step 2 without a break; run b after its crash and resume from step 1: the same numbers.
    for a_row, b_row in zip(a_rows, b_rows[:2], strict=False):
        for key in ("reward_mean", "loss", "grad_norm", "response_length"):
            assert b_row[key] == pytest.approx(a_row[key], rel=1e-5, abs=1e-7), (a_row["step"], key)


@pytest.mark.parametrize("settings, latest, said, logged", [
    # The defaults lose nothing: no run.save_every, no run.save_on_interrupt given; the step finishes and is saved
    # (before: "no checkpoint was written yet").
    (["run.save_every=0"], "step_000002", "step_000002", [1, 2]),
    # run.save_on_interrupt=false: it stops at once and keeps the last checkpoint.
    (["run.save_on_interrupt=false"], "step_000001", "stopped by SIGTERM", [1]),
], ids=["defaults-save-the-step", "no-save-stops-at-once"])
def test_sigterm_during_an_update(tmp_path, no_orphans, settings, latest, said, logged):
    """A scheduler's SIGTERM during step 2's update: exit 143, the resume command printed, the right checkpoint."""
    no_orphans.start()
    process = start(tmp_path, "pause-update:1:2", "run.name=t", *settings)
    signal_when_reached(tmp_path, process, signal.SIGTERM)
    code, output = finish(process)
    no_orphans.stop(f"SIGTERM during an update, {' '.join(settings)}")
    assert code == 143, output
    assert said in output and "--resume run.name=t" in output, output
    assert latest_complete(tmp_path / "runs" / "t" / "checkpoints").name == latest
    assert [row["step"] for row in metrics(tmp_path / "runs" / "t")] == logged


def test_a_reward_function_raising_on_one_rank_ends_the_job(tmp_path, no_orphans):
    no_orphans.start()
    code, output = finish(start(tmp_path, "reward:1:2", "run.name=r"))
    no_orphans.stop("reward function raises on rank 1")
    assert code == 1, output
    assert "rank 1 failed in phase reward: InjectedFault: reward function failed on purpose" in output, output
    assert latest_complete(tmp_path / "runs" / "r" / "checkpoints").name == "step_000001"
