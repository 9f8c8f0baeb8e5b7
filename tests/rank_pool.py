"""A warm pool of gloo ranks for the multi-rank tests: torch is imported once per worker, not once per test.

A job of N ranks (1 to 4) goes to the first N workers (started when first needed, then kept); each calls
``fn(rank, *args)`` in the test's environment as it is at the call (what a spawned rank would inherit), with
torchrun's variables (a new ``MASTER_PORT``: every job forms a new process group), and sends back what it returned
or raised. After a job a worker destroys the process group it made and puts back the working directory, torch's
default dtype and thread count and the backend registry. A job that fails or times out costs the pool its workers:
they are killed and the next job starts new ones, so a rank left waiting in a collective cannot poison the next
test.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait as wait_for

from accel_backends.collector import starting_children
from accel_backends.spawn import free_port

MAX_RANKS = 4  # jobs of more ranks start their own processes
FAILED_PEER_GRACE_S = 10.0  # how long the other rank may take to finish once one rank failed
SHUTDOWN_S = 3.0  # how long a worker may take to leave when asked (one stuck in a collective is killed)


class RankPool:
    """Spawned workers kept between tests; ``run`` is ``tests.distributed.run_ranks`` for up to ``MAX_RANKS``."""

    def __init__(self) -> None:
        self.workers: list = []  # (process, connection) per rank
        self.started = 0  # workers started over the pool's life (an interpreter each)

    def run(self, fn, args: tuple, world_size: int, env: dict, timeout: float) -> list:
        if len(self.workers) < world_size:
            self._start(world_size)
        port = str(free_port())
        job_env = {**os.environ, **env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                   "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size)}
        payload = pickle.dumps((fn, args, job_env))
        ranks = self.workers[:world_size]
        for _, connection in ranks:
            connection.send_bytes(payload)
        records = self._collect(ranks, fn, timeout)
        failed = [(rank, record) for rank, record in enumerate(records) if "error" in record]
        if failed:
            self.close()  # a rank may still sit in a collective, or the job left state behind: start afresh
            raise AssertionError("\n".join(f"rank {rank} (in the warm pool):\n{record['error']}"
                                           for rank, record in failed))
        return [record["result"] for record in records]

    def _collect(self, ranks: list, fn, timeout: float) -> list[dict]:
        records: list[dict | None] = [None] * len(ranks)
        deadline = time.monotonic() + timeout
        by_connection = {connection: rank for rank, (_, connection) in enumerate(ranks)}
        while any(record is None for record in records):
            waiting = [c for c, rank in by_connection.items() if records[rank] is None]
            sentinels = {process.sentinel: rank for rank, (process, _) in enumerate(ranks) if records[rank] is None}
            left = deadline - time.monotonic()
            if any(record is not None and "error" in record for record in records):
                left = min(left, FAILED_PEER_GRACE_S)  # the others may wait for the failed rank forever
            ready = wait_for([*waiting, *sentinels], timeout=max(left, 0)) if left > 0 else []
            if not ready:
                if any(record is not None for record in records):
                    return [record or {"error": "still running when another rank failed (killed)"}
                            for record in records]
                self.close()
                raise TimeoutError(f"{fn.__name__} did not finish within {timeout:g} s on the warm rank pool "
                                   f"(its workers were killed; the next test starts new ones)")
            for item in ready:
                if item in by_connection:
                    rank = by_connection[item]
                    try:
                        records[rank] = pickle.loads(item.recv_bytes())
                    except (EOFError, OSError):
                        records[rank] = {"error": "the worker exited without a result"}
                else:
                    rank = sentinels[item]
                    if records[rank] is None and not ranks[rank][1].poll():
                        code = ranks[rank][0].exitcode
                        records[rank] = {"error": f"the worker died (exit code {code}) before it answered"}
        return records  # type: ignore[return-value]

    def _start(self, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        for rank in range(len(self.workers), count):
            ours, theirs = context.Pipe()
            process = context.Process(target=_worker_main, args=(rank, theirs, os.getpid()), daemon=True,
                                      name=f"accel-pool-rank{rank}")
            with starting_children():  # its collector paused through its imports, as a LocalJob rank's is
                process.start()
            theirs.close()
            self.workers.append((process, ours))
            self.started += 1

    def close(self) -> None:
        """Ask each worker to leave (an ordinary exit: a coverage run keeps its data), kill the ones that don't."""
        for _, connection in self.workers:
            try:
                connection.send_bytes(b"")
            except OSError:
                pass
        for process, connection in self.workers:
            process.join(timeout=SHUTDOWN_S)
            if process.exitcode is None:
                process.kill()
                process.join(timeout=5)
            connection.close()
        self.workers = []


def _worker_main(rank: int, connection, parent_pid: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    import accel_backends
    import engine  # noqa: F401 - what nearly every job uses, imported once and frozen with torch
    from accel_backends.collector import freeze_startup

    freeze_startup()  # as a spawned rank does: the imports' objects are never walked again; the collector back on
    torch.set_num_threads(1)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    base_cwd, base_dtype = os.getcwd(), torch.get_default_dtype()
    while True:
        try:
            payload = connection.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)
        if not payload:  # the pool closes
            os._exit(0)
        try:
            fn, args, env = pickle.loads(payload)
            os.environ.clear()  # the test's environment now (a spawned rank inherits it), nothing of the last job
            os.environ.update({**env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
            accel_backends.reset_registry()
            record = {"result": fn(rank, *args)}
        except BaseException as exc:  # noqa: BLE001 - the test must see every way its rank failed
            record = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
        try:
            _tidy(torch, accel_backends, base_cwd, base_dtype)
            answer = pickle.dumps(record)
        except BaseException as exc:  # noqa: BLE001 - an unpicklable result or a failed teardown: said plainly
            answer = pickle.dumps({"error": f"after the job: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"})
        sys.stdout.flush()
        sys.stderr.flush()
        connection.send_bytes(answer)


def _tidy(torch, accel_backends, cwd: str, dtype) -> None:
    """Put back what a job may change, so the next test sees a worker as a fresh rank would be."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    os.chdir(cwd)
    torch.set_default_dtype(dtype)
    torch.set_num_threads(1)
    accel_backends.reset_registry()


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)
