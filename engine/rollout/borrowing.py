"""A trainer process borrowing the cores of idle local inference servers (``rollout.vllm.borrow_threads``): what
the rollout engine's core plan (``vllm_server/cores.py``) comes to on this process, and what ``--print-config``
shows of it. Any rollout engine may offer a ``core_plan``; the vLLM server engine does."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from ..runtime import BorrowedThreads, borrowing_problem, usable_cores


def borrow_idle_cores(engine, busy: Callable[[], bool]) -> BorrowedThreads | None:
    """Started borrowing for this process (None where the engine's plan borrows nothing and sets no threads):
    the plan's threads added while ``busy()`` is false, its own thread count (and, binding ``split``, its own
    cores) while true. Refused in one line where the borrowed threads would share a core with its own."""
    plan = getattr(engine, "core_plan", None)
    if plan is None or not (plan.borrow or plan.trainer_threads):
        return None
    base = plan.trainer_threads or torch.get_num_threads()
    problem = borrowing_problem(plan.borrow, base, usable_cores(), "rollout.vllm.borrow_threads")
    if problem:
        raise ValueError(problem)
    cores = plan.bound_cores(int(os.environ.get("LOCAL_RANK", "0")))
    return BorrowedThreads(busy, plan.borrow, base, cores).start()


def shown_borrowing(rollout_config, processes: int) -> dict | None:
    """``rollout.vllm.borrow_threads`` as this host would resolve it for ``processes`` trainer processes (threads,
    why, and under ``auto`` the cores): None where no vLLM server is used."""
    if rollout_config.engine != "vllm" or rollout_config.vllm.mode != "server":
        return None
    import accel_backends

    from .vllm_server.cores import this_host_plan

    try:
        backend = accel_backends.get_backend()
    except accel_backends.AccelBackendError as exc:  # the backend's own problem is reported before any worker
        return {"threads": 0, "why": f"unknown until the backend is usable: {exc}"}
    return this_host_plan(rollout_config.vllm, backend, processes).shown()
