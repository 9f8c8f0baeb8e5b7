"""Start N worker processes on this machine, watch them, and end the job fast and cleanly when something goes wrong.

``run(fn, nproc, *args)`` calls ``fn(*args)`` in every worker and returns rank 0's result. Under torchrun (its
variables set) it calls ``fn`` directly in this process, so multi-node is plain ``torchrun --nnodes ...``. One
process (``nproc=1``) also runs in this process, as rank 0 of a world of one: no spawn, no second import of torch
and the model code (about 2.5 s of start-up), with the same errors and exit statuses as a spawned worker.

What the launcher guarantees (``docs/engine.md``, "When something fails"):

* a worker that raises writes its rank, phase (``phase_labels.py``) and error to a file (``accel_backends.spawn``
  starts and watches the workers); the launcher polls them every 0.1 s, kills the others at once (they may be
  blocked in a collective) and raises ``WorkerFailed`` whose message is one uncut line naming the rank that
  failed first, its phase and its error (what followed and the tracebacks are its details, which the commands
  write to a file in the run directory). A worker killed by a signal (SIGKILL, the out-of-memory killer) is
  reported the same way;
* SIGINT / SIGTERM to the launcher are forwarded once to every worker; workers stop (at the next safe point when
  the training loop asked for that with ``stop_at_safe_point()``), the launcher waits up to ``grace_s`` and then
  kills what is left, and raises ``Interrupted`` (exit status 128 + signal number: 130, 143);
* no orphans: workers run in their own process group (a terminal's Ctrl-C reaches only the launcher, which
  forwards it exactly once) and exit by themselves if the launcher disappears.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable

from accel_backends.distributed import LAUNCHER_VARIABLES
from accel_backends.spawn import LocalJob, QuietExit, RankOutcome, free_port

from . import stop
from .phase_labels import phase_of
from .stop import install_stop_handlers, stop_requested
from .teardown import OneLineError, run_group_end_callbacks

DEFAULT_GRACE_S = 60.0  # how long workers get to reach a safe point (and save) after SIGINT/SIGTERM


class WorkerFailed(RuntimeError):
    """A worker process raised or died. The message is one line: the rank that failed first, its phase and its
    error, uncut; ``then`` the failures that followed (mostly its echo on the other ranks), ``tracebacks`` the
    failing ranks' tracebacks."""

    def __init__(self, message: str, tracebacks: dict[int, str] | None = None, then: list[str] | None = None) -> None:
        super().__init__(one_line(message))
        self.tracebacks = tracebacks or {}
        self.then = then or []

    def details(self) -> str:
        """What followed the first failure and every failing rank's traceback, labelled (empty when there is
        none): for a file, or printed before the message with ``--traceback``."""
        parts = [f"then {line}" for line in self.then]
        parts += [f"--- rank {rank} ---\n{trace.rstrip()}" for rank, trace in self.tracebacks.items() if trace]
        return "\n".join(parts)


def one_line(text: str) -> str:
    """``text`` on one line (an error message over several lines joined with spaces), nothing cut."""
    return " ".join(str(text).split())


class Interrupted(Exception):
    """The job was stopped by SIGINT or SIGTERM; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def report_early_end(prog: str, exc: WorkerFailed | Interrupted, then: str = "", *,
                     traceback_file: str | os.PathLike | None = None) -> int:
    """What a command line prints when ``run`` ended early, and its exit status: ``PROG: <how it was
    interrupted>`` (the interruption's status), or, for a failure (status 1), ``then`` (what the user can do
    next) and last one uncut line ``PROG: error: rank R failed in phase P: <error>``. The details (what followed,
    the tracebacks) go to ``traceback_file`` when given, its path in that line; else they are printed first."""
    if isinstance(exc, Interrupted):
        print(f"{prog}: {exc}" + (f"; {then}" if then else ""), file=sys.stderr)
        return exc.exit_code
    details, where = exc.details(), ""
    if details and traceback_file is not None:
        try:
            with open(traceback_file, "w") as handle:
                handle.write(f"{exc}\n{details}\n")
            where = f" (tracebacks: {traceback_file}; --traceback prints them)"
        except OSError as unwritable:  # a full disk, a read-only directory: still one line, saying so
            with contextlib.suppress(OSError):
                Path(traceback_file).unlink(missing_ok=True)  # no half-written file left behind
            where = f" (tracebacks not written to {traceback_file}: {unwritable.strerror}; --traceback prints them)"
    elif details:
        print(details, file=sys.stderr)
    if then:
        print(then, file=sys.stderr)
    print(f"{prog}: error: {exc}{where}", file=sys.stderr)
    return 1


def under_launcher() -> bool:
    return all(key in os.environ for key in LAUNCHER_VARIABLES)


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
    worker_env = dict(env or {})
    if "OMP_NUM_THREADS" not in {**os.environ, **worker_env}:
        worker_env["OMP_NUM_THREADS"] = str(threads_per_worker(nproc))
    job = LocalJob(_stoppable, (fn, args), nproc, env=worker_env, detach=True, describe=_phase_details)
    with _forwarding_signals(job) as received, job:
        job.wait(stop_requested=lambda: bool(received), grace_s=grace_s)
        # Exit codes as the workers left them: the ones killed on leaving were stopped, they did not fail.
        exitcodes = job.exitcodes()
    if received:
        raise Interrupted(received[0])
    outcomes = job.outcomes
    if any(code not in (None, 0) for code in exitcodes):
        raise WorkerFailed(*_describe(outcomes, exitcodes))
    return outcomes[0].result


def _run_here(fn: Callable[..., Any], args: tuple, env: dict[str, str] | None) -> Any:
    """``fn(*args)`` as the only rank, in this process; this process's environment and signal handlers are restored
    after, and a process group ``fn`` left behind is destroyed."""

    variables = {**(env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "1",
                 "LOCAL_WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    saved_env = {key: os.environ.get(key) for key in variables}
    saved_handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    saved_stop = stop.state()
    group_before = _has_group()
    os.environ.update(variables)
    install_stop_handlers()
    saved_threads = _take_threads(variables.get("OMP_NUM_THREADS"))
    try:
        return _call_stoppable(fn, args)
    except BaseException as exc:  # reported as a spawned worker's failure is: rank, phase, error, traceback
        if isinstance(exc, (Interrupted, KeyboardInterrupt, SystemExit)):
            raise  # (torch's CheckpointException is a BaseException too: a failure, reported as one)
        where = f" in phase {phase_of(exc)}" if phase_of(exc) else ""
        trace = None if isinstance(exc, OneLineError) else traceback.format_exc()
        said = _phase_details(exc).get("summary") or f"{type(exc).__name__}: {exc}"
        raise WorkerFailed(f"rank 0 failed{where}: {said}".strip(), {0: trace}) from exc
    finally:
        _take_threads(saved_threads)
        _end_group_made_since(group_before)
        for signum, handler in saved_handlers.items():
            signal.signal(signum, handler)
        stop.restore(saved_stop)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _take_threads(threads: str | int | None) -> int | None:
    """The intra-op pool at ``threads`` (the ``OMP_NUM_THREADS`` the caller's ``env`` asks), as a spawned rank
    sets it (``accel_backends.spawn``): torch read the variable when this process imported it, so setting it now
    comes too late. Without this the in-process rank of ``run(fn, 1, env={"OMP_NUM_THREADS": "1"})`` ran on every
    core while each of 2 spawned ranks ran on one: the 1-rank side of issue 49's comparison had twice the threads.
    Returns the size found, to put back."""
    if not threads:
        return None
    import torch

    found = torch.get_num_threads()
    if int(threads) != found:
        torch.set_num_threads(int(threads))
    return found


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
    """``fn(*args)`` in this process; a stop by SIGINT/SIGTERM (at once, or at a safe point) ends as Interrupted.
    What must close while the process group exists (``teardown.at_group_end``) closes when ``fn`` ends."""
    try:
        result = fn(*args)
    except KeyboardInterrupt:
        if not stop_requested():
            raise
        raise Interrupted(stop_requested()) from None
    finally:
        run_group_end_callbacks()
    if stop_requested():
        raise Interrupted(stop_requested())
    return result


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_worker(nproc: int) -> int:
    """CPU threads each of ``nproc`` workers may use when the user set no ``OMP_NUM_THREADS``: the cores this
    process may run on, shared out. Left to torch, every worker would start one thread per core, and ``nproc``
    workers oversubscribe the cores (on 2 cores, 2 ranks ran a step 1.1-3.7x slower and far less steadily)."""
    return max(1, usable_cores() // nproc)


class _forwarding_signals:
    """While active, SIGINT/SIGTERM to the launcher are recorded and sent on to every live worker."""

    def __init__(self, job: LocalJob) -> None:
        self.job, self.received, self.saved = job, [], {}

    def _handler(self, signum, frame) -> None:
        self.received.append(signum)
        self.job.send(signum)  # a rank still starting gets it once it takes signals

    def __enter__(self) -> list[int]:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.saved[signum] = signal.signal(signum, self._handler)
        return self.received

    def __exit__(self, *exc) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)


def _stoppable(fn: Callable[..., Any], args: tuple) -> Any:
    """What every spawned worker runs: ``fn(*args)`` with the stop handlers in place; a requested stop leaves with
    exit status 128 + the signal number and no error record (it is not a failure)."""
    install_stop_handlers()
    try:
        return _call_stoppable(fn, args)
    except Interrupted as stopped:
        raise QuietExit(stopped.exit_code) from None


def _phase_details(exc: BaseException) -> dict:
    details = {"phase": phase_of(exc), "one_line": isinstance(exc, OneLineError)}
    failures = getattr(exc, "failures", None)  # torch's CheckpointException: every rank's traceback in its message
    if isinstance(failures, dict) and failures:
        causes = dict.fromkeys(f"{type(pair[0]).__name__}: {pair[0]}" for pair in failures.values()
                               if isinstance(pair, tuple) and pair and isinstance(pair[0], BaseException))
        if causes:  # the causes alone (a full disk: "OSError: [Errno 28] No space left on device"), once each
            ranks = ", ".join(str(rank) for rank in failures)
            details["summary"] = f"{type(exc).__name__} (ranks {ranks}): {'; '.join(causes)}"
    return details


def _describe(outcomes: list[RankOutcome], exitcodes: list[int | None]) -> tuple[str, dict[int, str], list[str]]:
    """The first failure (a rank killed by a signal, else one that exited without an exception, else the
    earliest reported error), the failing ranks' tracebacks, and the failures that followed."""
    raised = sorted((o for o in outcomes if o.error is not None), key=lambda o: o.raised_at)
    killed = [rank for rank, code in enumerate(exitcodes) if code is not None and code < 0
              and outcomes[rank].error is None]
    lines = [f"rank {rank} failed: killed by {signal.Signals(-exitcodes[rank]).name} (out of memory, or killed "
             "from outside)" for rank in killed]
    # A rank gone without a word is the likelier cause than the others' errors (mostly: their peer went away).
    for rank, code in enumerate(exitcodes):
        if code not in (None, 0) and outcomes[rank].error is None and rank not in killed:
            lines.append(f"rank {rank} failed: exited with status {code} without a Python exception (a hard exit "
                         "or a crash in native code: see its output above)")
    for outcome in raised:
        phase = outcome.details.get("phase")
        where = f" in phase {phase}" if phase else ""
        lines.append(f"rank {outcome.rank} failed{where}: {one_line(outcome.details.get('summary') or outcome.error)}")
    # The first failure is the message; what followed is mostly its echo (connection reset ...): details.
    lines = lines or ["a worker failed without saying how"]
    return lines[0], {o.rank: o.traceback for o in raised if not o.details.get("one_line")}, lines[1:]
