"""Start the kit's multi-process job: N local processes with torchrun's variables, each returning its outcomes.

Each rank writes its result to a file, so a rank that crashes, hangs or breaks the group cannot hide the others'
results; a job past its timeout is killed and reported.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(local_rank, fn, args, nproc, port, out_dir):
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(nproc),
                      LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        outcome = {"result": fn(*args)}
    except BaseException:  # noqa: BLE001 - reported to the parent, whatever it was
        outcome = {"error": traceback.format_exc()}
    Path(out_dir, f"{local_rank}.pkl").write_bytes(pickle.dumps(outcome))
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without tearing the process group down: gloo's exit-time cleanup can abort after the work is done.
    os._exit(0)


def run_job(fn, args: tuple, nproc: int, timeout: float) -> list[dict]:
    """Call ``fn(*args)`` in ``nproc`` spawned ranks; per rank ``{"result": ...}`` or ``{"error": text}``."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="accel-conformance-") as out_dir:
        context = mp.start_processes(_rank_main, args=(fn, args, nproc, free_port(), out_dir), nprocs=nproc,
                                     join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            while not all(not p.is_alive() for p in context.processes):
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.1)
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join(5)
        outcomes = []
        for rank, process in enumerate(context.processes):
            path = Path(out_dir, f"{rank}.pkl")
            if path.exists():
                outcomes.append(pickle.loads(path.read_bytes()))
            elif timed_out:
                outcomes.append({"error": f"rank {rank} did not finish within {timeout:.0f} s (a hang in a "
                                          "collective or a device call?)"})
            else:
                outcomes.append({"error": f"rank {rank} died with exit code {process.exitcode} before reporting"})
        return outcomes
