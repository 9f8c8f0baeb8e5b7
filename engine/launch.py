"""Start N worker processes on this machine, watch them, and end the job fast and cleanly when something goes wrong.

``run(fn, nproc, *args)`` calls ``fn(*args)`` in every worker and returns rank 0's result. Under torchrun (its
variables set) it calls ``fn`` directly in this process, so multi-node is plain ``torchrun --nnodes ...``. One
process (``nproc=1``) also runs in this process, as rank 0 of a world of one: no spawn, no second import of torch
and the model code (about 2.5 s of start-up), with the same errors and exit statuses as a spawned worker.

What the launcher guarantees (``docs/engine.md``, "When something fails"):

* a worker that raises writes its rank, phase (``engine.phase``) and error to a file; the launcher polls the
  workers every 0.1 s, kills the others at once (they may be blocked in a collective) and raises ``WorkerFailed``
  whose message names the rank that failed first, its phase and its error. A worker killed by a signal (SIGKILL,
  the out-of-memory killer) is reported the same way;
* SIGINT / SIGTERM to the launcher are forwarded once to every worker; workers stop (at the next safe point when
  the training loop asked for that with ``stop_at_safe_point()``), the launcher waits up to ``grace_s`` and then
  kills what is left, and raises ``Interrupted`` (exit status 128 + signal number: 130, 143);
* no orphans: workers run in their own process group (a terminal's Ctrl-C reaches only the launcher, which
  forwards it exactly once) and exit by themselves if the launcher disappears.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from accel_backends.distributed import LAUNCHER_VARIABLES

from .phase import phase_of

POLL_S = 0.1
DEFAULT_GRACE_S = 60.0  # how long workers get to reach a safe point (and save) after SIGINT/SIGTERM


class WorkerFailed(RuntimeError):
    """A worker process raised or died; the message carries its rank, phase and error, ``tracebacks`` the details."""

    def __init__(self, message: str, tracebacks: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.tracebacks = tracebacks or {}


class Interrupted(Exception):
    """The job was stopped by SIGINT or SIGTERM; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def under_launcher() -> bool:
    return all(key in os.environ for key in LAUNCHER_VARIABLES)


# -- inside a worker: stop requests --------------------------------------------------------------------------------

_stop = {"signum": 0, "graceful": False}


def _on_stop_signal(signum, frame) -> None:
    first = not _stop["signum"]
    _stop["signum"] = _stop["signum"] or signum
    if not (_stop["graceful"] and first):
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def install_stop_handlers() -> None:
    """SIGINT and SIGTERM stop this process: at once, or at the next safe point after ``stop_at_safe_point()``."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_stop_signal)


def stop_at_safe_point(enabled: bool = True) -> None:
    """The training loop checks ``stop_requested()`` at safe points; a first signal waits for one, a second does not."""
    _stop["graceful"] = enabled


def stop_requested() -> int:
    """The signal number that asked this process to stop (0: none). Ranks must agree on it (a collective) before acting."""
    return _stop["signum"]


# -- the launcher --------------------------------------------------------------------------------------------------


def run(fn: Callable[..., Any], nproc: int, *args: Any, env: dict[str, str] | None = None,
        grace_s: float = DEFAULT_GRACE_S) -> Any:
    """Run ``fn(*args)`` on ``nproc`` local workers (or in-process under torchrun); return rank 0's result."""
    if under_launcher():  # torchrun watches the workers; a stop by signal still ends as Interrupted
        install_stop_handlers()
        group_before = _has_group()
        result = _call_stoppable(fn, args)
        _end_group_made_since(group_before)  # before the interpreter exits: see _end_group_made_since
        return result
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    if nproc == 1 and threading.current_thread() is threading.main_thread():
        return _run_here(fn, args, env)
    with tempfile.TemporaryDirectory(prefix="accel-launch-") as report_dir:
        context = multiprocessing.get_context("spawn")
        worker_env = {**os.environ, **(env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                      "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc)}
        worker_env.setdefault("OMP_NUM_THREADS", str(threads_per_worker(nproc)))
        workers = [context.Process(target=_worker_main, name=f"accel-rank{rank}", daemon=False,
                                   args=(rank, worker_env, report_dir, os.getpid(), fn, args))
                   for rank in range(nproc)]
        with _forwarding_signals(workers) as received:
            for worker in workers:
                worker.start()
            try:
                _watch(workers, received, grace_s)
                # Exit codes as the workers left them: the ones killed below were stopped, they did not fail.
                failures = {rank: w.exitcode for rank, w in enumerate(workers) if w.exitcode not in (None, 0)}
            finally:
                _kill_all(workers)
        if received:
            raise Interrupted(received[0])
        if failures:
            raise WorkerFailed(*_describe(failures, Path(report_dir)))
        return pickle.loads(Path(report_dir, "result.pkl").read_bytes())


def _run_here(fn: Callable[..., Any], args: tuple, env: dict[str, str] | None) -> Any:
    """``fn(*args)`` as the only rank, in this process; this process's environment and signal handlers are restored
    after, and a process group ``fn`` left behind is destroyed."""

    variables = {**(env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "1",
                 "LOCAL_WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    saved_env = {key: os.environ.get(key) for key in variables}
    saved_handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    saved_stop = dict(_stop)
    group_before = _has_group()
    os.environ.update(variables)
    install_stop_handlers()
    try:
        return _call_stoppable(fn, args)
    except Exception as exc:  # reported as a spawned worker's failure is: rank, phase, error, traceback
        if isinstance(exc, Interrupted):
            raise
        where = f" in phase {phase_of(exc)}" if phase_of(exc) else ""
        raise WorkerFailed(f"rank 0 failed{where}: {type(exc).__name__}: {exc}".strip(),
                           {0: traceback.format_exc()}) from exc
    finally:
        _end_group_made_since(group_before)
        for signum, handler in saved_handlers.items():
            signal.signal(signum, handler)
        _stop.update(saved_stop)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _has_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _end_group_made_since(group_before: bool) -> None:
    """Destroy the process group ``fn`` created, while the interpreter is still whole: left to the exit-time
    teardown, gloo sometimes aborts the process ("terminate called without an active exception") after all
    the work is done, which torchrun then reports as a failed rank."""
    import torch.distributed as dist

    if not group_before and _has_group():
        dist.destroy_process_group()


def _call_stoppable(fn: Callable[..., Any], args: tuple) -> Any:
    """``fn(*args)`` in this process; a stop by SIGINT/SIGTERM (at once, or at a safe point) ends as Interrupted."""
    try:
        result = fn(*args)
    except KeyboardInterrupt:
        if not stop_requested():
            raise
        raise Interrupted(stop_requested()) from None
    if stop_requested():
        raise Interrupted(stop_requested())
    return result


def threads_per_worker(nproc: int) -> int:
    """CPU threads each of ``nproc`` workers may use when the user set no ``OMP_NUM_THREADS``: the cores this
    process may run on, shared out. Left to torch, every worker would start one thread per core, and ``nproc``
    workers oversubscribe the cores (on 2 cores, 2 ranks ran a step 1.1-3.7x slower and far less steadily)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // nproc)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _forwarding_signals:
    """While active, SIGINT/SIGTERM to the launcher are recorded and sent on to every live worker."""

    def __init__(self, workers) -> None:
        self.workers, self.received, self.saved = workers, [], {}

    def _handler(self, signum, frame) -> None:
        self.received.append(signum)
        for worker in self.workers:
            if worker.pid is not None and worker.exitcode is None:
                try:
                    os.kill(worker.pid, signum)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> list[int]:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.saved[signum] = signal.signal(signum, self._handler)
        return self.received

    def __exit__(self, *exc) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)


def _watch(workers, received: list[int], grace_s: float) -> None:
    """Return when every worker has exited, or kill them all when one fails or the grace time after a signal ends."""
    deadline = None
    while True:
        codes = [w.exitcode for w in workers]
        if all(code is not None for code in codes):
            return
        if received:
            deadline = deadline or time.monotonic() + grace_s
            if time.monotonic() > deadline:
                return  # the caller kills what is left
        elif any(code not in (None, 0) for code in codes):
            return  # one failed: the others may wait in a collective forever, so they are killed now
        time.sleep(POLL_S)


def _kill_all(workers) -> None:
    for worker in workers:
        if worker.exitcode is None and worker.pid is not None:
            try:
                os.killpg(worker.pid, signal.SIGKILL)  # the worker leads its own group: helpers it forked go too
            except (ProcessLookupError, PermissionError):
                worker.kill()
    for worker in workers:
        worker.join(timeout=5)


# -- what each worker runs ------------------------------------------------------------------------------------------


def _worker_main(rank, env, report_dir, launcher_pid, fn, args) -> None:
    os.setpgrp()  # a terminal's Ctrl-C goes to the launcher only, which forwards it once
    os.environ.update(env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    if "torch" in sys.modules:  # imported while unpickling ``fn``: the variable alone may come too late
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    threading.Thread(target=_exit_with_launcher, args=(launcher_pid,), daemon=True).start()
    install_stop_handlers()
    code = 0
    try:
        result = fn(*args)
        if rank == 0:
            Path(report_dir, "result.pkl").write_bytes(pickle.dumps(result))
        code = 128 + stop_requested() if stop_requested() else 0
    except BaseException as exc:  # noqa: BLE001 - the launcher must learn about every way a worker ends
        code = _report(rank, exc, report_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without tearing down the process group: that can block on peers that are gone, and gloo's exit-time
    # cleanup sometimes aborts after the work is done.
    os._exit(code)


def _report(rank: int, exc: BaseException, report_dir: str) -> int:
    if isinstance(exc, KeyboardInterrupt) and stop_requested():
        return 128 + stop_requested()
    record = {"rank": rank, "phase": phase_of(exc), "error": f"{type(exc).__name__}: {exc}".strip(),
              "time": time.time(), "traceback": traceback.format_exc()}
    Path(report_dir, f"failure_rank{rank}.json").write_text(json.dumps(record))
    if isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code:
        return exc.code
    return 1


def _exit_with_launcher(launcher_pid: int) -> None:
    while os.getppid() == launcher_pid:
        time.sleep(1.0)
    os._exit(1)  # the launcher is gone (killed): do not linger as an orphan


def _describe(exit_codes: dict[int, int], report_dir: Path) -> tuple[str, dict[int, str]]:
    """One line that puts the first failure first: a rank killed by a signal, else the earliest reported error."""
    records = {}
    for path in report_dir.glob("failure_rank*.json"):
        record = json.loads(path.read_text())
        records[record["rank"]] = record
    killed = sorted(rank for rank, code in exit_codes.items() if code < 0 and rank not in records)
    lines = [f"rank {rank} failed: killed by {signal.Signals(-exit_codes[rank]).name} (out of memory, or killed "
             "from outside)" for rank in killed]
    for record in sorted(records.values(), key=lambda r: r["time"]):
        where = f" in phase {record['phase']}" if record["phase"] else ""
        error = record["error"]
        if lines and len(error) > 160:  # what follows the first failure is mostly its echo (connection reset ...)
            error = error[:160] + " ..."
        lines.append(f"rank {record['rank']} failed{where}: {error}")
    for rank, code in sorted(exit_codes.items()):
        if rank not in records and rank not in killed:
            lines.append(f"rank {rank} failed: exited with status {code} without a Python exception (a hard exit "
                         "or a crash in native code: see its output above)")
    if len(lines) > 1:
        lines[1:] = ["then " + line for line in lines[1:]]
    tracebacks = {rank: record["traceback"] for rank, record in records.items()}
    return "; ".join(lines), tracebacks
