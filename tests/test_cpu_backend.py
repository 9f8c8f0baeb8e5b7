"""The CPU backend for real: host memory figures, moves, randomness and a real 2-process gloo group."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import REPO

from accel_backends import DistributedSetupError, MemoryStats
from accel_backends.backends.cpu import CPUBackend

MiB = 2**20


def touch(num_bytes):
    buffer = torch.empty(num_bytes, dtype=torch.uint8)
    buffer.fill_(1)  # write every page so it becomes resident
    return buffer


def test_memory_figures_move_with_allocations_and_peak_resets():
    backend = CPUBackend()
    before = backend.memory_stats()
    assert isinstance(before, MemoryStats) and before.reserved is None
    assert before.total > 0 and 0 < before.free <= before.total

    buffer = touch(300 * MiB)
    during = backend.memory_stats()
    assert during.allocated - before.allocated > 250 * MiB
    assert during.peak_allocated >= during.allocated

    del buffer
    after_free = backend.memory_stats()
    assert after_free.peak_allocated >= during.allocated, "the peak remembers the freed buffer"
    backend.reset_peak_memory_stats()
    after_reset = backend.memory_stats()
    assert after_reset.peak_allocated < during.allocated - 200 * MiB, "reset forgets the old peak"


def test_moves_round_trip_on_the_host():
    backend = CPUBackend()
    tensor = torch.randn(4, 5)
    on_device = backend.to_device(tensor)
    back = backend.to_host(on_device)
    assert on_device.device == backend.device() == torch.device("cpu")
    assert torch.equal(back, tensor)
    assert backend.fsdp_device_id() == torch.device("cpu")
    assert backend.metrics_device() == torch.device("cpu")


def test_rng_state_round_trip():
    backend = CPUBackend()
    backend.manual_seed(1234)
    state = backend.rng_state()
    first = torch.rand(3)
    backend.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)


def test_single_process_group_without_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    backend = CPUBackend()
    try:
        info = backend.init_distributed(timeout=30)
        assert (info.rank, info.world_size, info.launched) == (0, 1, False)
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
        assert backend.init_distributed() == info, "calling it again is a no-op"
        value = torch.ones(2)
        dist.all_reduce(value)
        assert value.tolist() == [1.0, 1.0]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_incomplete_launcher_environment_is_named(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistributedSetupError, match="LOCAL_RANK, MASTER_ADDR, MASTER_PORT missing"):
        CPUBackend().init_distributed()
    assert not dist.is_initialized()


@pytest.mark.slow
def test_two_process_gloo_group_under_torchrun(tmp_path):
    env_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(REPO / "tests" / "scripts" / "allreduce.py"), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(env_cmd, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, doc in enumerate(ranks):
        assert doc["rank"] == doc["again_rank"] == rank
        assert (doc["backend"], doc["dist_backend"], doc["world_size"]) == ("cpu", "gloo", 2)
        assert doc["launched"] and doc["local_rank"] == rank
        assert doc["sum"] == 3.0  # 1 + 2
