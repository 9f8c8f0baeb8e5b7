"""``launch.run(fn, 1)`` runs ``fn`` in the calling process as rank 0 of one: results, failures and stop signals
come back exactly as from a spawned worker, and the caller's environment, signal handlers and (absent) process
group are as they were afterwards."""

import os
import signal

import pytest

from engine import runtime as launch
from engine.runtime import phase

ENV = {"ACCEL_BACKEND": "cpu"}


def _train_like(value):
    import torch.distributed as dist

    import accel_backends

    info = accel_backends.get_backend().init_distributed()
    return {"value": value, "rank": dist.get_rank(), "world": dist.get_world_size(), "pid": os.getpid(),
            "launched": info.launched, "RANK": os.environ.get("RANK")}


def _fails_in_forward():
    with phase("forward"):
        raise ValueError("boom in the model")


def _stopped(graceful):
    launch.stop_at_safe_point(graceful)
    os.kill(os.getpid(), signal.SIGTERM)
    assert graceful and launch.stop_requested() == signal.SIGTERM  # graceful: the loop reaches a safe point
    return "saved"


def test_one_process_runs_here_and_leaves_the_caller_as_it_was():
    import torch.distributed as dist

    handler = signal.getsignal(signal.SIGINT)
    had_rank = "RANK" in os.environ
    first = launch.run(_train_like, 1, 7, env=ENV)
    assert first == {"value": 7, "rank": 0, "world": 1, "pid": os.getpid(), "launched": True, "RANK": "0"}
    assert not dist.is_initialized() and signal.getsignal(signal.SIGINT) is handler
    assert ("RANK" in os.environ) == had_rank
    assert launch.run(_train_like, 1, 8, env=ENV)["value"] == 8  # a second run builds its group afresh


def test_a_failure_names_rank_phase_and_error():
    with pytest.raises(launch.WorkerFailed) as failed:
        launch.run(_fails_in_forward, 1, env=ENV)
    assert str(failed.value) == "rank 0 failed in phase forward: ValueError: boom in the model"
    assert "boom in the model" in failed.value.tracebacks[0]
    assert isinstance(failed.value.__cause__, ValueError)


@pytest.mark.parametrize("graceful", [False, True])
def test_a_stop_signal_ends_as_interrupted(graceful):
    with pytest.raises(launch.Interrupted) as stopped:
        launch.run(_stopped, 1, graceful, env=ENV)
    assert stopped.value.exit_code == 143
    assert launch.stop_requested() == 0  # the caller's stop state is untouched


def _threads():
    import torch

    return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()


@pytest.mark.slow
def test_spawned_workers_share_the_cores_unless_told(monkeypatch):
    """Two workers that each took every core would oversubscribe them; a user's OMP_NUM_THREADS wins."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    share = launch.threads_per_worker(2)
    assert share == max(1, len(os.sched_getaffinity(0)) // 2)
    assert launch.run(_threads, 2, env=ENV) == (str(share), share)
    assert launch.run(_threads, 2, env={**ENV, "OMP_NUM_THREADS": "3"}) == ("3", 3)
