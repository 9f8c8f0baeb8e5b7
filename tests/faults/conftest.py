"""The fault-injection suite: every test here is marked ``faults`` (run only these with ``-m faults``) and ``slow``."""

import time

import psutil
import pytest
from pool_commands import start_pool


def pytest_configure(config):
    config.addinivalue_line("markers", "faults: fault injection (tests/faults/): nothing lost, nothing hangs")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/faults/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def warm_pool():
    """The warm rank pool's workers started (they live for the session): named before ``no_orphans`` by a test that
    runs its runs without a fault on the pool, so that they are not counted as left behind."""
    start_pool()


@pytest.fixture
def no_orphans(tmp_path, monkeypatch):
    """Fails the test if a process it started outlives it; yields a stopwatch that prints the time to a clean exit."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}

    def started_here():  # multiprocessing's resource tracker belongs to this process and ends with it
        return [p for p in me.children(recursive=True) if p.pid not in before
                and p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())]

    monkeypatch.setenv("FAULT_STAMP", str(tmp_path / "fault-fired"))
    watch = Stopwatch(tmp_path / "fault-fired")
    yield watch
    deadline = time.monotonic() + 5
    while True:
        left = started_here()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"processes left behind: {[(p.pid, p.cmdline()[:3]) for p in left]}"


class Stopwatch:
    """Prints the wall time from the fault to a clean exit (collected for the issue's note), and the whole run's.

    Workers write when the fault fired into ``stamp`` (env ``FAULT_STAMP``); without it the run's start counts.
    """

    def __init__(self, stamp):
        self.stamp = stamp

    def start(self):
        self.started = time.time()

    def stop(self, label: str) -> float:
        ended = time.time()
        fired = float(self.stamp.read_text()) if self.stamp.exists() else self.started
        print(f"\nFAULT-TIME {label}: {ended - fired:.1f} s from the fault to a clean exit "
              f"({ended - self.started:.1f} s for the whole run)")
        return ended - fired
