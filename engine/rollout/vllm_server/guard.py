"""``python -m engine.rollout.vllm_server.guard PARENT_PID [--cores 2,3] -- COMMAND...``: runs one vLLM server and
makes sure none of its processes outlives the run; with ``--cores``, on those CPU cores only (every process and
thread the server starts inherits them).

The manager starts this guard as the leader of a new process group; the server (API server, engine core, worker)
runs inside that group. The guard ends the whole group when it is told to (SIGTERM/SIGINT), when the server exits
(so a crashed server leaves no engine core behind), or when the trainer that started it is gone (Linux's parent-
death signal, and a poll of the parent's pid where that signal is missing): SIGTERM first, SIGKILL after
``GRACE_S``. Standard library only, so it starts in a fraction of a second.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the parent poll below still ends the server
        pass


def end_group(group: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM to every process of ``group`` but this one, then SIGKILL to what is left after ``grace_s``."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _others_alive(group):
        time.sleep(0.1)
    try:
        os.killpg(group, signal.SIGKILL)  # this guard included: nothing of the group is left
    except ProcessLookupError:
        pass


def _others_alive(group: int) -> bool:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                if os.getpgid(int(entry)) == group:
                    with open(f"/proc/{entry}/stat") as stat:
                        if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                            return True
            except (ProcessLookupError, PermissionError, FileNotFoundError):
                continue
    return False


def main(argv: list[str]) -> int:
    parent, options, command = int(argv[0]), argv[1:argv.index("--")], argv[argv.index("--") + 1:]
    _die_with_parent()
    if options[:1] == ["--cores"] and hasattr(os, "sched_setaffinity"):  # Linux: CPU affinity
        os.sched_setaffinity(0, {int(core) for core in options[1].split(",")})
    stop = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, frame: stop.append(received))
    server = subprocess.Popen(command)
    while not stop and server.poll() is None and os.getppid() == parent:
        time.sleep(0.2)
    end_group(os.getpgid(0))
    return server.returncode or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
