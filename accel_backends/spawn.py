"""Start N local processes as torchrun would (its variables set), watch them, and collect what each one returned.

One primitive for everything that runs a job on this machine: the engine's launcher (``accel-grpo --nproc``),
the conformance kit's multi-process rules and the tests. Each rank writes its outcome to a file of its own, so a
rank that crashes, hangs or breaks the process group cannot hide what the others returned or raised. Ranks exit
by themselves when the process that started them disappears, so nothing is left behind even after a SIGKILL.

    with LocalJob(fn, (1, 2), nproc=2, env={"OMP_NUM_THREADS": "1"}) as job:
        job.wait(timeout=300)            # "done", "failed" (one rank failed, others may still wait) or "timeout"
    outcomes = job.outcomes              # one RankOutcome per rank: result, or error and traceback
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from .collector import freeze_startup, starting_children

POLL_S = 0.1


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now (for ``MASTER_PORT``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def forget_working_directory() -> None:
    """Take off ``sys.path`` the working directory Python put first for ``python -m`` / ``-c`` (``''`` or its path):
    a ``torch_npu.py`` lying in the directory a command runs in must not be imported by the launcher or a worker
    in place of the installed package (a backend's probe imports it by name). A directory the user put on
    ``PYTHONPATH`` stays: that one they chose."""
    if sys.flags.safe_path or not sys.path:
        return
    first = sys.path[0]
    if first == "" or os.path.realpath(first) == os.path.realpath(os.getcwd()):
        del sys.path[0]


class _SafePathForChildren:
    """While ranks start: ``PYTHONSAFEPATH=1``, so that a spawned interpreter (``python -c ...`` until it takes this
    process's ``sys.path``) puts no working directory first either; each rank then puts the variable back as the
    user had it, for the processes it starts itself."""

    def __init__(self) -> None:
        self.before = os.environ.get("PYTHONSAFEPATH")

    def __enter__(self) -> None:
        os.environ["PYTHONSAFEPATH"] = "1"

    def __exit__(self, *exc) -> None:
        _restore("PYTHONSAFEPATH", self.before)


@contextlib.contextmanager
def _sigint_ignored(active: bool):
    """SIGINT ignored in this process (and so in the processes it starts) while active; the handler put back."""
    if not active:
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


class QuietExit(SystemExit):
    """Raised in a rank to leave with this exit status and no error record (a requested stop, not a failure)."""


@dataclasses.dataclass
class RankOutcome:
    """How one rank ended. ``exitcode`` is negative for a signal and ``None`` when it was still running."""

    rank: int
    exitcode: int | None
    returned: bool = False
    result: Any = None
    error: str | None = None  # "TypeError: message" of the exception the rank raised
    traceback: str | None = None
    details: dict = dataclasses.field(default_factory=dict)  # what ``describe`` said about the exception
    raised_at: float | None = None  # time.time() when it raised: which rank failed first

    @property
    def failed(self) -> bool:
        return self.error is not None or self.exitcode not in (0, None)


class LocalJob:
    """``nproc`` spawned ranks calling ``fn(*args)``; a context manager that kills what is left on exit.

    ``env``: variables for every rank (torchrun's own are set here: ``RANK``, ``WORLD_SIZE``...). ``detach``:
    each rank leads its own process group, so a terminal's Ctrl-C reaches only this process (which may forward
    it). ``describe(exc) -> dict`` runs in the rank that raised and adds details to its outcome (it must be
    importable there, as ``fn`` must).
    """

    def __init__(self, fn: Callable[..., Any], args: tuple = (), nproc: int = 2, *, env: dict | None = None,
                 detach: bool = False, describe: Callable[[BaseException], dict] | None = None) -> None:
        if nproc < 1:
            raise ValueError(f"nproc must be at least 1, got {nproc}")
        self.fn, self.args, self.nproc, self.detach, self.describe = fn, args, nproc, detach, describe
        self.env = {**(env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                    "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc)}
        self.processes: list = []
        self._pending: list[tuple[int, int]] = []  # (rank, signal) to send once the rank has started
        self._outcomes: list[RankOutcome] | None = None
        self._directory: str | None = None

    def __enter__(self) -> LocalJob:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._directory = tempfile.mkdtemp(prefix="accel-job-")
        context = multiprocessing.get_context("spawn")
        safe_path = _SafePathForChildren()
        env = {"PYTHONSAFEPATH": safe_path.before, **self.env}  # as the user had it, once the rank runs
        self.processes = [
            context.Process(target=_rank_main, name=f"accel-rank{rank}", daemon=False,
                            args=(rank, self.fn, self.args, env, self._directory, os.getpid(), self.detach,
                                  self.describe))
            for rank in range(self.nproc)]
        # Detached ranks start with SIGINT ignored (kept across exec): a terminal's Ctrl-C reached them while they
        # were still in this process group, importing, and each printed a KeyboardInterrupt traceback. A rank takes
        # SIGINT again once in its own group (``started``); what ``send`` had for it before is delivered then. A
        # Ctrl-C in the few milliseconds of the start itself is not seen.
        # starting_children: each rank's collector stays paused through its imports (collector.py).
        ignore_sigint = self.detach and threading.current_thread() is threading.main_thread()
        with safe_path, starting_children(), _sigint_ignored(ignore_sigint):
            for process in self.processes:
                process.start()

    def send(self, signum: int) -> None:
        """Send ``signum`` to every live rank; a detached rank still starting gets it once it takes signals."""
        for rank, process in enumerate(self.processes):
            if process.pid is not None and process.exitcode is None:
                self._pending.append((rank, signum))
        self._deliver()

    def _deliver(self) -> None:
        pending, self._pending, waiting = self._pending, [], []  # taken first: a signal handler may send meanwhile
        for rank, signum in pending:
            process = self.processes[rank]
            if process.exitcode is not None or self._directory is None:  # gone, or the job closed
                continue
            if self.detach and not Path(self._directory, f"rank{rank}.started").exists():
                waiting.append((rank, signum))
                continue
            try:
                os.kill(process.pid, signum)
            except ProcessLookupError:
                pass
        self._pending.extend(waiting)

    def exitcodes(self) -> list[int | None]:
        return [process.exitcode for process in self.processes]

    def wait(self, timeout: float | None = None, stop_on_failure: bool = True,
             stop_requested: Callable[[], bool] = lambda: False, grace_s: float = 0.0) -> str:
        """Wait until every rank exited (``"done"``); or until one failed while others run (``"failed"``, when
        ``stop_on_failure``: they may wait in a collective forever); or ``timeout`` seconds (``"timeout"``); or
        ``grace_s`` after ``stop_requested()`` became true (``"stopped"``). Kill what is left with ``kill()``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        grace_deadline = None
        while True:
            codes = self.exitcodes()
            if all(code is not None for code in codes):
                return "done"
            if stop_requested():
                grace_deadline = grace_deadline or time.monotonic() + grace_s
                if time.monotonic() > grace_deadline:
                    return "stopped"
            elif stop_on_failure and any(code not in (None, 0) for code in codes):
                return "failed"
            if deadline is not None and time.monotonic() > deadline:
                return "timeout"
            if self._pending:
                self._deliver()
            time.sleep(POLL_S)

    def kill(self) -> None:
        """SIGKILL every rank still running (with the helpers it forked, when detached) and reap them all."""
        for process in self.processes:
            if process.exitcode is None and process.pid is not None:
                try:
                    if self.detach:
                        os.killpg(process.pid, signal.SIGKILL)  # the rank leads its own group: helpers it forked go too
                    else:
                        process.kill()
                except (ProcessLookupError, PermissionError):
                    process.kill()
        for process in self.processes:
            process.join(timeout=5)

    @property
    def outcomes(self) -> list[RankOutcome]:
        """One outcome per rank, read from the files the ranks wrote (after ``wait``/``kill``)."""
        if self._outcomes is None:
            self._outcomes = [self._read(rank, process.exitcode) for rank, process in enumerate(self.processes)]
        return self._outcomes

    def _read(self, rank: int, exitcode: int | None) -> RankOutcome:
        outcome = RankOutcome(rank=rank, exitcode=exitcode)
        path = Path(self._directory, f"rank{rank}.pkl")
        try:
            record = pickle.loads(path.read_bytes())
        except (FileNotFoundError, EOFError, pickle.UnpicklingError):
            return outcome  # no whole record (killed before or while writing it): its exit code tells
        for key, value in record.items():
            setattr(outcome, key, value)
        return outcome

    def close(self) -> None:
        self.kill()
        self.outcomes  # noqa: B018 - read before the files go
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


def _rank_main(rank, fn, args, env, directory, parent_pid, detach, describe) -> None:
    if detach:
        os.setpgrp()  # a terminal's Ctrl-C goes to the parent only, which may forward it
    for name, value in env.items():
        _restore(name, value)  # None: unset (PYTHONSAFEPATH, set only while the ranks started)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    threads = env.get("OMP_NUM_THREADS")
    if threads and "torch" in sys.modules:  # imported while unpickling ``fn``: the variable alone came too late
        sys.modules["torch"].set_num_threads(int(threads))
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    record: dict = {}
    code = 0
    try:
        if detach:  # inside the try: a signal sent the moment the rank takes it is recorded as the rank's end
            signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored while it started in the parent's group
            Path(directory, f"rank{rank}.started").touch()  # the parent's ``send`` may now reach it
        freeze_startup()  # this process is ours: what its imports made is never walked again (collector.py)
        record = {"returned": True, "result": fn(*args)}
    except QuietExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - the parent must learn about every way a rank ends
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code else 1
        record = {"error": f"{type(exc).__name__}: {exc}".strip(), "traceback": traceback.format_exc(),
                  "raised_at": time.time(), "details": _details(describe, exc)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C (forwarded) must not cut the record short
    try:
        payload = pickle.dumps(record)
    except Exception:  # noqa: BLE001 - a result that cannot be pickled is this rank's failure, said plainly
        code = code or 1
        payload = pickle.dumps({"error": "the rank's result could not be pickled",
                                "traceback": traceback.format_exc(), "raised_at": time.time()})
    # Written aside and renamed: a rank killed while writing (the parent stopping the others) leaves no half file.
    partial = Path(directory, f"rank{rank}.pkl.partial")
    partial.write_bytes(payload)
    os.replace(partial, Path(directory, f"rank{rank}.pkl"))
    sys.stdout.flush()
    sys.stderr.flush()
    _release_named_semaphores()
    # Leave without tearing the process group down: that can block on peers that are gone, and gloo's exit-time
    # cleanup sometimes aborts ("terminate called without an active exception") after the work is done.
    os._exit(code)


def _release_named_semaphores() -> None:
    """Unlink the named semaphores that libraries made in this rank (multiprocessing locks: vLLM's, tqdm's), as a
    normal exit would. ``os._exit`` skips multiprocessing's finalizers, and Python's resource tracker then ends
    the job with "There appear to be N leaked semaphore objects". Only the semaphores' own finalizers run; the
    registry and ``_callback`` are multiprocessing's private names (CPython 3.10-3.13), so any surprise is
    ignored: the warning is cosmetic."""
    try:
        from multiprocessing import synchronize, util

        for finalizer in list(util._finalizer_registry.values()):
            if getattr(finalizer, "_callback", None) is synchronize.SemLock._cleanup:
                finalizer()
    except Exception:  # noqa: BLE001 - never let tidying up change how a rank ends
        pass


def _details(describe, exc: BaseException) -> dict:
    if describe is None:
        return {}
    try:
        return dict(describe(exc))
    except Exception as problem:  # noqa: BLE001 - a broken describer must not hide the rank's own error
        return {"describe_failed": repr(problem)}


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)  # the parent is gone (killed): do not linger as an orphan
