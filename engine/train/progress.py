"""Rank 0's progress bar (tqdm on stderr).

tqdm guards its output with a multiprocessing lock by default: a named semaphore registered with Python's
resource tracker. A rank ends with ``os._exit`` (``accel_backends.spawn``: no teardown that could block on gone
peers), so the semaphore was never unregistered and every run ended with ``resource_tracker: There appear to be 1
leaked semaphore objects``. Only one process writes the bar: a thread lock is all it needs.
"""

from __future__ import annotations

import sys
import threading


def progress_bar(total: int, initial: int, desc: str):
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, dynamic_ncols=True)
