"""Run a function on N real processes that form a gloo group through the CPU backend, as torchrun would."""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(local_rank, fn, args, world_size, port, out_dir, env):
    os.environ.update(env)
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    outcome = {}
    try:
        outcome["result"] = fn(local_rank, *args)
    except BaseException:
        outcome["error"] = traceback.format_exc()
    try:
        payload = pickle.dumps(outcome)
    except Exception:
        outcome = {"error": "the result could not be pickled:\n" + traceback.format_exc()}
        payload = pickle.dumps(outcome)
    Path(out_dir, f"{local_rank}.pkl").write_bytes(payload)
    # Leave without tearing down gloo: its exit-time cleanup sometimes aborts ("terminate called without an
    # active exception") after the work is done, which would fail a test that passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if "error" in outcome else 0)


def run_ranks(fn, *args, world_size: int = 2, timeout: float = 300, env: dict | None = None) -> list:
    """Call ``fn(rank, *args)`` in ``world_size`` spawned processes; return each rank's result.

    ``fn`` must be importable (defined at module level). A rank that raises fails the call with its traceback;
    a job that outlives ``timeout`` seconds is killed and fails the call.
    """
    env = {"ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1", **(env or {})}
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(_worker, args=(fn, args, world_size, free_port(), out_dir, env),
                                     nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fn.__name__} did not finish within {timeout} s")
        except mp.ProcessRaisedException as exc:
            raise AssertionError(f"a rank raised:\n{exc}") from None
        except mp.ProcessExitedException as exc:
            errors = [str(exc)]
            for rank in range(world_size):
                path = Path(out_dir, f"{rank}.pkl")
                if path.exists():
                    outcome = pickle.loads(path.read_bytes())
                    if "error" in outcome:
                        errors.append(f"rank {rank}:\n{outcome['error']}")
            raise AssertionError("\n".join(errors)) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        return [pickle.loads(Path(out_dir, f"{r}.pkl").read_bytes())["result"] for r in range(world_size)]
