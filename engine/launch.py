"""Start N worker processes on this machine through torch's elastic launcher, or join an existing torchrun job.

``run(fn, nproc, *args)`` calls ``fn(*args)`` in every worker and returns rank 0's result. Under torchrun (its
variables set) it calls ``fn`` directly in this process, so multi-node is plain ``torchrun --nnodes ...``. If a
worker dies, the launcher stops the others and raises ``WorkerFailed`` naming the rank and its error: no rank is
left waiting forever.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Callable

from accel_backends.distributed import LAUNCHER_VARIABLES


class WorkerFailed(RuntimeError):
    """A worker process raised or died; the message carries its rank and error, ``tracebacks`` the details."""

    def __init__(self, message: str, tracebacks: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.tracebacks = tracebacks or {}


def under_launcher() -> bool:
    return all(key in os.environ for key in LAUNCHER_VARIABLES)


def run(fn: Callable[..., Any], nproc: int, *args: Any, env: dict[str, str] | None = None) -> Any:
    """Run ``fn(*args)`` on ``nproc`` local workers (or in-process under torchrun); return rank 0's result."""
    if under_launcher():
        return _entry(fn, *args)
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"accel-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.2,
        start_method="spawn",
    )
    # The elastic agent logs every failure at length; WorkerFailed carries what the user needs.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    saved = {key: os.environ.get(key) for key in (env or {})}
    os.environ.update(env or {})  # workers inherit this process's environment
    try:
        results = elastic_launch(config, _entry)(fn, *args)
    except ChildFailedError as exc:
        raise WorkerFailed(*_describe(exc)) from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return results[0]


def _entry(fn, *args):
    """What each worker runs: ``fn``, then a clean teardown of the process group.

    On an error the group is left alone: tearing it down could block on peers, and the launcher must see this
    worker's own error first (not the connection errors it causes in the others).
    """
    import torch.distributed as dist

    result = fn(*args)
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


def _describe(exc) -> tuple[str, dict[int, str]]:
    lines, tracebacks = [], {}
    for rank, failure in sorted(exc.failures.items()):
        message = failure.message
        if isinstance(message, dict):
            tracebacks[rank] = str(message.get("extraInfo", {}).get("py_callstack", ""))
            message = message.get("message", message)
        text = str(message).strip().splitlines()
        summary = text[-1] if text else f"exit code {failure.exitcode}"
        if failure.exitcode < 0:
            summary = f"killed by signal {-failure.exitcode}"
        lines.append(f"rank {rank} failed: {summary}")
    return "; ".join(lines) or str(exc), tracebacks
