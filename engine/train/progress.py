"""Rank 0's progress: a tqdm bar on a terminal, and one plain line every few steps when stderr goes to a file or a
pipe (a bar redrawn there floods the log with carriage returns).

tqdm guards its output with a multiprocessing lock by default: a named semaphore registered with Python's
resource tracker. A rank ends with ``os._exit`` (``accel_backends.spawn``: no teardown that could block on gone
peers), so the semaphore was never unregistered and every run ended with ``resource_tracker: There appear to be 1
leaked semaphore objects``. Only one process writes the bar: a thread lock is all it needs.
"""

from __future__ import annotations

import sys
import threading
import time

LINES = 10  # lines a run writes when not on a terminal (plus its last step)


def progress_bar(total: int, initial: int, desc: str, stream=None):
    """A bar on a terminal, else ``LineProgress`` (the same methods: ``update``, ``set_postfix``, ``write``,
    ``close``)."""
    stream = stream or sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return LineProgress(total, initial, desc, stream)
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    return tqdm(total=total, initial=initial, desc=desc, file=stream, dynamic_ncols=True)


class LineProgress:
    """One line per ``every`` steps (about ``LINES`` in a run) and at the last step:
    ``grpo: step 20/200 (10%, 31 s) reward=0.41``."""

    def __init__(self, total: int, initial: int, desc: str, stream) -> None:
        self.total, self.n, self.desc, self.stream = total, initial, desc, stream
        self.every = max(1, total // LINES)
        self.postfix: dict = {}
        self.started = time.perf_counter()

    def set_postfix(self, shown: dict) -> None:
        self.postfix = dict(shown)

    def update(self, steps: int = 1) -> None:
        self.n += steps
        if self.n % self.every == 0 or self.n >= self.total:
            figures = " ".join(f"{key}={value}" for key, value in self.postfix.items())
            share = f"{100 * self.n / max(self.total, 1):.0f}%"
            self.write(f"{self.desc}: step {self.n}/{self.total} ({share}, {time.perf_counter() - self.started:.0f} s)"
                       + (f" {figures}" if figures else ""))

    def write(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        pass
