"""``accel-backends smoke`` for real: 2 local ranks through torch's own launcher, and a rank that never joins."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_backends.spawn import free_port

REPO = Path(__file__).resolve().parent.parent


def _env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(ACCEL_BACKEND="cpu", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


@pytest.mark.slow
def test_smoke_under_torchrun_and_a_rank_that_never_joins():
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         "-m", "accel_backends", "smoke", "--size-mb", "1", "--iters", "2"],
        env=_env(), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    out = launched.stdout
    assert "backend cpu (gloo), 2 ranks on 1 host(s)" in out
    host_rows = [line.split() for line in out.splitlines() if line.split()[:1] and line.split()[1:3] == ["0-1", "2"]]
    assert len(host_rows) == 1 and host_rows[0][3] == "cpu", out
    assert "all-reduce of each rank's rank+1: ok (expected 3)" in out
    assert "all-reduce of 1 MiB: ok" in out and "bus bandwidth" in out
    assert out.count("verdict: OK") == 1  # rank 0 alone reports

    # WORLD_SIZE=2 but only rank 0 starts: it cannot join, and says so in one line within --timeout.
    alone = subprocess.run(
        [sys.executable, "-m", "accel_backends", "smoke", "--timeout", "2", "--size-mb", "1"],
        env={**_env(), "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())},
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert alone.returncode == 2, alone.stdout + alone.stderr
    error = alone.stderr.strip()
    assert error.startswith("accel-backends: error: rank 0 of 2 could not join the 'gloo' group at 127.0.0.1:")
    assert "within 2 s" in error and "\n" not in error
