"""Memory figures in one shape for every device, and the host-memory readings the CPU backend needs."""

from __future__ import annotations

import dataclasses
import os
import resource
import sys


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Bytes; ``None`` where a device has no such figure (a CPU has no caching allocator, so no ``reserved``)."""

    allocated: int | None = None
    reserved: int | None = None
    peak_allocated: int | None = None
    total: int | None = None
    free: int | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def as_gib(self) -> dict:
        """The same figures in GiB rounded to 3 places, for logs and metrics."""
        return {k: None if v is None else round(v / 2**30, 3) for k, v in self.as_dict().items()}


def _status_bytes(*fields: str) -> dict[str, int]:
    """``kB`` fields of ``/proc/self/status`` in bytes, read in one pass (empty off Linux).

    The engine reads memory around every mini-batch, so one read serves both the current and the peak figure.
    """
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return found
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in fields:
            found[name] = int(rest.split()[0]) * 1024
            if len(found) == len(fields):
                break
    return found


def _status_kib(field: str) -> int | None:
    """One ``kB`` field of ``/proc/self/status`` in bytes, or ``None`` off Linux."""
    return _status_bytes(field).get(field)


def process_rss() -> int:
    """Resident set size of this process now."""
    rss = _status_kib("VmRSS")
    if rss is not None:
        return rss
    # No procfs (macOS, some sandboxes): the best we have is the lifetime peak.
    return _ru_maxrss()


def _ru_maxrss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class PeakRSSTracker:
    """Peak resident memory since the last ``reset()``.

    ``ru_maxrss`` cannot be reset, so on Linux we reset the kernel's high-water mark (``VmHWM``) by writing ``5``
    to ``/proc/self/clear_refs``. Where that is not allowed, the peak is the largest RSS seen by ``observe()``,
    which every ``memory_stats()`` call makes: coarser, but it never reports a figure from before the reset.
    """

    def __init__(self) -> None:
        self._kernel_reset_works = False
        self._observed_peak = 0
        self.reset()

    def reset(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            reset_done = True
        except OSError:
            reset_done = False
        status = _status_bytes("VmRSS", "VmHWM")
        self._kernel_reset_works = reset_done and "VmHWM" in status
        self._observed_peak = status["VmRSS"] if "VmRSS" in status else process_rss()

    def observe(self) -> int:
        return self.sample()[1]

    def sample(self) -> tuple[int, int]:
        """(RSS now, peak since the reset), from one read of ``/proc/self/status``."""
        status = _status_bytes("VmRSS", "VmHWM")
        rss = status.get("VmRSS")
        if rss is None:
            rss = process_rss()
        self._observed_peak = max(self._observed_peak, rss)
        if self._kernel_reset_works and "VmHWM" in status:
            self._observed_peak = max(self._observed_peak, status["VmHWM"])
        return rss, self._observed_peak


def host_memory_total_and_free() -> tuple[int | None, int | None]:
    """Host memory this process may use: the machine's, capped by a cgroup v2 limit (containers)."""
    total = free = None
    try:
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:  # MemTotal, MemFree and MemAvailable are the first lines: stop there
                name, _, rest = line.partition(":")
                info[name] = int(rest.split()[0]) * 1024
                if "MemAvailable" in info:
                    break
        total, free = info.get("MemTotal"), info.get("MemAvailable", info.get("MemFree"))
    except (OSError, ValueError, IndexError):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    limit, used = _cgroup_limit_and_usage()
    if limit is not None and (total is None or limit < total):
        total = limit
        if used is not None:
            free = min(free, limit - used) if free is not None else limit - used
    return total, free


def _cgroup_limit_and_usage() -> tuple[int | None, int | None]:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            raw = f.read().strip()
        if raw == "max":
            return None, None
        with open("/sys/fs/cgroup/memory.current") as f:
            return int(raw), int(f.read().strip())
    except (OSError, ValueError):
        return None, None
