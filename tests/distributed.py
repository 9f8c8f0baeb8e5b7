"""Run a function on N real processes that form a gloo group through the CPU backend, as torchrun would.

Under pytest, jobs of up to four ranks run on the session's warm pool (``rank_pool.RankPool``, set by the
``rank_pool`` fixture in conftest.py); ``fresh=True``, more ranks, or no pool (a script) start new processes.
"""

from __future__ import annotations

import os

from rank_pool import MAX_RANKS

from accel_backends.spawn import LocalJob


def _with_rank(fn, *args):
    import torch

    torch.set_num_threads(1)
    return fn(int(os.environ["RANK"]), *args)


POOL = None  # the session's warm RankPool while pytest runs (conftest.py), else None


def run_ranks(fn, *args, world_size: int = 2, timeout: float = 300, env: dict | None = None,
              fresh: bool = False) -> list:
    """Call ``fn(rank, *args)`` in ``world_size`` processes; return each rank's result.

    ``fn`` must be importable (defined at module level). A rank that raises fails the call with its traceback;
    a job that outlives ``timeout`` seconds is killed and fails the call. ``fresh``: new interpreters even where
    the warm pool could run it (a job that changes a process for good, or needs its start-up to run).
    """
    env = {"ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1", **(env or {})}
    if POOL is not None and not fresh and world_size <= MAX_RANKS:
        return POOL.run(fn, args, world_size, env, timeout)
    with LocalJob(_with_rank, (fn, *args), world_size, env=env) as job:
        ended = job.wait(timeout=timeout)
    if ended == "timeout":
        raise TimeoutError(f"{fn.__name__} did not finish within {timeout} s")
    failed = [o for o in job.outcomes if o.failed]
    if failed:
        raise AssertionError("\n".join(f"rank {o.rank} (exit code {o.exitcode}):\n{o.traceback or o.error or ''}"
                                       for o in failed))
    return [o.result for o in job.outcomes]
