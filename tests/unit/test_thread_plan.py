"""Threads per rank (issue 49): the 1-rank side of a 1-rank against 2-rank comparison runs as many intra-op threads
as each rank of the 2-rank side.

``engine.runtime.run(fn, 1, env=...)`` runs its only rank in this process, where torch read ``OMP_NUM_THREADS``
at import: the variable the caller's ``env`` sets came too late, and the rank ran on every core while each spawned
rank of ``run(fn, 2, env=...)`` ran the asked count (``accel_backends.spawn`` sets it). The scaling benchmark's
1-rank figure was then a 2-thread figure. Counted, not timed.
"""

from __future__ import annotations

import os

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
