"""Threads per rank (issue 49): the 1-rank side of a 1-rank against 2-rank comparison runs as many intra-op threads
as each rank of the 2-rank side.

``engine.runtime.run(fn, 1, env=...)`` runs its only rank in this process, where torch read ``OMP_NUM_THREADS``
at import: the variable the caller's ``env`` sets came too late, and the rank ran on every core while each spawned
rank of ``run(fn, 2, env=...)`` ran the asked count (``accel_backends.spawn`` sets it). The scaling benchmark's
1-rank figure was then a 2-thread figure. Counted, not timed.
"""

from __future__ import annotations

import os

import pytest
import torch

from engine.bench.scaling import thread_census
from engine.runtime import run


def _threads_here() -> tuple[int, str | None]:
    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")


def test_the_in_process_rank_runs_the_threads_its_env_asks_and_gives_them_back():
    before = torch.get_num_threads()
    asked = 1 if before > 1 else 2  # a count other than the process's own, so that ignoring it shows
    threads, variable = run(_threads_here, 1, env={"OMP_NUM_THREADS": str(asked)})
    assert (threads, variable) == (asked, str(asked))
    assert torch.get_num_threads() == before  # the launching process keeps its own pool


def test_the_census_counts_a_rank_pool_and_its_threads():
    census = thread_census()
    assert census["intra_op"] == torch.get_num_threads()
    assert census["interop"] == torch.get_num_interop_threads()
    assert census["os_threads"] >= 1


def _rank(rank: int, threads: int, wall: float, tokens: float) -> dict:
    step = {"wall_s": wall, "cpu_s": wall, "tokens": tokens,
            "phases_s": {"rollout": wall / 2, "old_log_probs": 0.0, "ref_log_probs": 0.0, "update": wall / 2},
            "phases_cpu_s": {"rollout": wall / 2, "old_log_probs": 0.0, "ref_log_probs": 0.0, "update": wall / 2},
            "collectives": {"all_gather": 66}, "threads": {"intra_op": threads, "interop": 2, "os_threads": 7}}
    return {"rank": rank, "steps": [step]}


def test_a_job_is_the_slower_rank_and_every_rank_s_tokens_and_a_pool_other_than_asked_is_refused():
    from engine.bench.scaling import check_threads, summarize

    job = summarize([_rank(0, 1, 2.0, 700.0), _rank(1, 1, 2.5, 500.0)])
    assert job["step_s"] == 2.5 and job["tokens_per_step"] == 1200.0 and job["tokens_per_s"] == 1200.0 / 2.5
    assert job["phases_cpu_s"]["update"] == 2.25 and job["collectives_per_step"] == {"all_gather": 66}
    check_threads(job, 1)
    mixed = summarize([_rank(0, 2, 1.0, 1000.0)])
    with pytest.raises(RuntimeError, match="1-rank job ran rank 0: 2 intra-op threads, not the 1 asked"):
        check_threads(mixed, 1)
