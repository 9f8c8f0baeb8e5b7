"""The warm rank pool that runs the multi-rank tests: a failed or hung job does not reach the next one."""

import os

import pytest
from distributed import run_ranks
from rank_pool import RankPool


def _group_and_state(rank):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    seen = (os.environ.get("POOL_TEST_MARK"), os.getcwd(), torch.get_default_dtype(), dist.get_world_size())
    os.environ["POOL_TEST_MARK"] = "left behind"  # the next job must not see it
    os.chdir("/")
    torch.set_default_dtype(torch.float64)
    return total.item(), seen


def _fails_on_rank_one(rank):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if rank == 1:
        raise ValueError("rank one refuses")
    dist.barrier()  # rank 0 waits here for a peer that is gone


def _hangs(rank):
    import time

    time.sleep(600)


def test_jobs_share_workers_and_each_sees_a_fresh_group_and_state(monkeypatch):
    monkeypatch.delenv("POOL_TEST_MARK", raising=False)
    pool = RankPool()
    try:
        first = pool.run(_group_and_state, (), 2, {}, timeout=120)
        second = pool.run(_group_and_state, (), 2, {}, timeout=120)
        assert pool.started == 2  # two interpreters for both jobs
        assert [total for total, _ in first] == [3.0, 3.0] == [total for total, _ in second]
        for _, (mark, cwd, dtype, world) in first + second:
            assert (mark, cwd, str(dtype), world) == (None, os.getcwd(), "torch.float32", 2)
        monkeypatch.setenv("POOL_TEST_MARK", "set by the test")  # as a spawned rank inherits it
        (alone,) = pool.run(_group_and_state, (), 1, {}, timeout=120)
        assert alone[0] == 1.0 and alone[1][0] == "set by the test" and alone[1][3] == 1
    finally:
        pool.close()


def test_a_failed_job_names_its_rank_and_the_next_job_starts_new_workers():
    pool = RankPool()
    try:
        with pytest.raises(AssertionError, match="(?s)rank 1 .*ValueError: rank one refuses"):
            pool.run(_fails_on_rank_one, (), 2, {}, timeout=120)
        assert pool.workers == []
        totals = pool.run(_group_and_state, (), 2, {}, timeout=120)
        assert [total for total, _ in totals] == [3.0, 3.0] and pool.started == 4
    finally:
        pool.close()


def test_a_hung_job_times_out_with_its_name_and_the_pool_recovers():
    pool = RankPool()
    try:
        with pytest.raises(TimeoutError, match="_hangs did not finish within 1 s on the warm rank pool"):
            pool.run(_hangs, (), 2, {}, timeout=1)
        assert [total for total, _ in pool.run(_group_and_state, (), 2, {}, timeout=120)] == [3.0, 3.0]
    finally:
        pool.close()


def test_run_ranks_uses_the_session_pool_for_two_ranks():
    import distributed

    before = distributed.POOL.started
    run_ranks(_group_and_state)
    run_ranks(_group_and_state)
    assert distributed.POOL.started - before <= 2  # at most one start (if an earlier test's failure closed it)
