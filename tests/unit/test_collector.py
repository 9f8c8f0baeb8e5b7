"""accel_backends/collector.py: Python's collector kept off the objects that importing torch, FSDP and transformers
makes. Counted, not timed: the collections an import runs, the objects frozen, the collector's state afterwards."""

import gc
import multiprocessing
import os
import subprocess
import sys

import pytest

from accel_backends.collector import STARTING_ENV, freeze_startup, paused_collector, starting_children

COUNT_COLLECTIONS = """
import gc
runs = []
gc.callbacks.append(lambda phase, info: phase == "start" and runs.append(info["generation"]))
import engine
print(len(runs), gc.isenabled())
"""


def test_importing_the_engine_runs_almost_no_collections():
    """Before the pause: about 580 collections (6 of them full) while ``import engine`` made its objects."""
    done = subprocess.run([sys.executable, "-c", COUNT_COLLECTIONS], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    collections, enabled = done.stdout.split()
    assert int(collections) < 60 and enabled == "True", done.stdout


@pytest.fixture
def collector_restored(monkeypatch):
    monkeypatch.delenv(STARTING_ENV, raising=False)
    was = gc.isenabled()
    yield
    gc.enable() if was else gc.disable()


def test_a_pause_leaves_the_collector_as_it_found_it(collector_restored):
    gc.enable()
    with paused_collector():
        assert not gc.isenabled()
        with paused_collector():  # a pause inside a pause does not end the outer one
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()  # the caller turned it off: it stays off
    with paused_collector():
        pass
    assert not gc.isenabled()


def test_a_starting_rank_stays_paused_until_its_start_is_frozen(collector_restored, monkeypatch):
    gc.enable()
    monkeypatch.setenv(STARTING_ENV, "1")
    with paused_collector():  # the variable alone (a process another thread started meanwhile): collects as usual
        pass
    assert gc.isenabled()
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # as in a rank multiprocessing spawned
    with paused_collector():
        pass
    assert not gc.isenabled()  # its imports go on without collections until the rank's work begins
    frozen = gc.get_freeze_count()
    freeze_startup()  # in this test process too (conftest froze its start): what is alive now stays
    assert gc.isenabled() and gc.get_freeze_count() > frozen and gc.get_count()[0] == 0
    assert STARTING_ENV not in os.environ  # the start is over: what the rank starts does not inherit it


def test_children_started_inside_get_the_variable_and_the_environment_is_put_back(monkeypatch):
    monkeypatch.delenv(STARTING_ENV, raising=False)
    with starting_children():
        assert os.environ[STARTING_ENV] == "1"
    assert STARTING_ENV not in os.environ
    monkeypatch.setenv(STARTING_ENV, "outer")
    with starting_children():
        pass
    assert os.environ[STARTING_ENV] == "outer"
