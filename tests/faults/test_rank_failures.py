"""One rank fails inside forward, backward or the optimizer step, or stalls: the whole job ends within a bounded
time, with a message naming the rank, the phase and the original error, and no process left behind."""

import pytest

from engine.runtime import WorkerFailed, run

CASES = {  # fault -> what the message must say
    "forward": ("rank 1 failed in phase forward", "InjectedFault: forward of layer 1"),
    "backward": ("rank 1 failed in phase backward", "InjectedFault: backward through layer 1"),
    "step": ("rank 1 failed in phase optimizer step", "InjectedFault: optimizer step"),
    # The stalled rank never errs: the rank waiting for it times out in a collective and names where it waited.
    "stall": ("rank 0 failed in phase", "timed out"),
}


@pytest.mark.parametrize("fault", list(CASES))
def test_one_failing_rank_ends_the_job(fault, no_orphans):
    from faults.rank_faults import train_with_fault

    no_orphans.start()
    with pytest.raises(WorkerFailed) as failed:
        run(train_with_fault, 2, fault, 5.0, env={"ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1"})
    no_orphans.stop(f"rank 1 {fault}")
    message = str(failed.value)
    print(message)
    for part in CASES[fault]:
        assert part.lower() in message.lower(), message


def test_workers_do_not_outlive_a_killed_launcher(tmp_path, no_orphans):
    """SIGKILL gives the launcher no chance to clean up: the workers notice and exit by themselves."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    here = Path(__file__).resolve().parent
    # The killed launcher cannot remove its report folder: keep it inside this test's own temporary folder.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parents[1])]), "TMPDIR": str(tmp_path)}
    launcher = subprocess.Popen([sys.executable, str(here / "rank_faults.py"), str(tmp_path)], env=env)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("rank*.pid"))) < 2:
        assert launcher.poll() is None and time.monotonic() < deadline, "the workers never started"
        time.sleep(0.1)
    workers = [psutil.Process(int(p.read_text())) for p in tmp_path.glob("rank*.pid")]
    no_orphans.start()
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    gone, alive = psutil.wait_procs(workers, timeout=30)
    no_orphans.stop("launcher SIGKILLed: workers exit by themselves")
    for process in alive:
        process.kill()
    assert not alive, "workers outlived their launcher"
