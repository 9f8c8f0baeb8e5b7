"""Host memory figures where Linux's files are missing or say more (accel_backends/memory.py): no procfs (macOS, some
sandboxes), a kernel that refuses to reset its high-water mark, and a container whose cgroup limit is below the
machine's memory. The CPU backend's ``memory_stats()`` and every step's peak-memory metric stand on these."""

import builtins
import io

import pytest

from accel_backends import memory

GIB = 2**30


def _files(monkeypatch, contents: dict[str, str], refused=("/proc/",)):
    """``open`` in accel_backends.memory sees ``contents`` by path; paths under ``refused`` raise as if missing."""

    def fake_open(path, mode="r", *args, **kwargs):
        path = str(path)
        if path in contents:
            return io.StringIO(contents[path])
        if path.startswith(refused):
            raise FileNotFoundError(path)
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(memory, "open", fake_open, raising=False)


def test_without_procfs_the_rss_is_the_lifetime_peak_and_the_tracker_keeps_its_own_peak(monkeypatch):
    _files(monkeypatch, {}, refused=("/proc/",))
    peak = memory._ru_maxrss()
    assert peak > 0 and memory.process_rss() >= peak  # the lifetime peak only grows
    tracker = memory.PeakRSSTracker()
    assert tracker._kernel_reset_works is False
    rss, since_reset = tracker.sample()
    assert rss >= peak and since_reset >= rss and tracker.observe() >= since_reset


def test_a_kernel_that_refuses_the_reset_gives_the_largest_rss_seen_since_it(monkeypatch):
    status = {"/proc/self/status": "Name:\tpython\nVmHWM:\t 900000 kB\nVmRSS:\t 100000 kB\n"}
    _files(monkeypatch, status, refused=("/proc/self/clear_refs",))
    tracker = memory.PeakRSSTracker()
    assert tracker._kernel_reset_works is False  # the old high-water mark (900000 kB) predates the reset
    assert tracker.sample() == (100000 * 1024, 100000 * 1024)
    status["/proc/self/status"] = "VmHWM:\t 900000 kB\nVmRSS:\t 300000 kB\n"
    assert tracker.observe() == 300000 * 1024
    status["/proc/self/status"] = "VmHWM:\t 900000 kB\nVmRSS:\t 200000 kB\n"
    assert tracker.sample() == (200000 * 1024, 300000 * 1024)


MEMINFO = "MemTotal:       16777216 kB\nMemFree:         1048576 kB\nMemAvailable:    8388608 kB\nBuffers: 1 kB\n"


@pytest.mark.parametrize("limit, current, want", [
    ("max", "0", (16 * GIB, 8 * GIB)),  # no limit: the machine's figures
    (str(4 * GIB), str(3 * GIB), (4 * GIB, 1 * GIB)),  # a 4 GiB container using 3: 1 GiB left, not the host's 8
    (str(32 * GIB), str(1 * GIB), (16 * GIB, 8 * GIB)),  # a limit above the machine's memory changes nothing
    ("not a number", "0", (16 * GIB, 8 * GIB)),  # an unreadable limit is no limit
], ids=["no-limit", "container-limit", "limit-above-machine", "unreadable"])
def test_a_cgroup_limit_below_the_machine_is_the_total_and_caps_the_free(monkeypatch, limit, current, want):
    _files(monkeypatch, {"/proc/meminfo": MEMINFO, "/sys/fs/cgroup/memory.max": limit,
                         "/sys/fs/cgroup/memory.current": current}, refused=("/nothing/",))
    assert memory.host_memory_total_and_free() == want


def test_without_proc_meminfo_the_total_comes_from_sysconf_and_free_is_unknown(monkeypatch):
    _files(monkeypatch, {}, refused=("/proc/", "/sys/fs/cgroup/"))
    total, free = memory.host_memory_total_and_free()
    assert total is not None and total > GIB and free is None


def test_without_proc_meminfo_a_container_limit_still_gives_both(monkeypatch):
    _files(monkeypatch, {"/sys/fs/cgroup/memory.max": str(2 * GIB), "/sys/fs/cgroup/memory.current": str(GIB // 2)},
           refused=("/proc/",))
    assert memory.host_memory_total_and_free() == (2 * GIB, 2 * GIB - GIB // 2)
