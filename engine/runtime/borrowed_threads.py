"""Borrowing the cores of idle inference servers: a wider intra-op thread pool while nobody else computes.

An inference server on the trainer's own CPU cores (``rollout.vllm.mode=server`` on one host) idles between its
batches, while the trainer, given one thread per core it owns, leaves the server's cores empty. ``BorrowedThreads``
gives the trainer's compute thread ``base + extra`` intra-op threads whenever ``busy()`` says no request is in
flight, and ``base`` otherwise, so the two never share a core. It looks again before every module's forward and,
in the backward pass, when each module output's gradient arrives: a switch waits at most one module's work, not a
whole micro-batch's.

torch's thread count belongs to the thread that sets it (OpenMP's setting is per thread), so only the thread that
started the borrowing switches; a hook that fires on another thread leaves the pool as it is. With ``cores`` the
switch also binds every thread of the process: to its own cores while the servers compute, to its own and the
servers' while they idle (the ``split`` binding of ``rollout.vllm.borrow_threads=auto``;
engine/rollout/vllm_server/cores.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

import torch
from torch.nn.modules import module as module_hooks


def borrowing_problem(extra: int, base: int, cores: int, key: str) -> str | None:
    """Why ``base + extra`` threads cannot run on ``cores`` cores without sharing one, as a sentence (else None)."""
    if base + extra <= cores:
        return None
    return (f"{key}={extra}: this process runs {base} intra-op thread(s) (OMP_NUM_THREADS) and may use only {cores} "
            f"core(s), so borrowed threads would share a core with its own and slow both: let the process run on the "
            f"servers' cores too (taskset / its CPU affinity) or set {key}=0")


class BorrowedThreads:
    """While active, the starting thread's intra-op pool has ``base + extra`` threads when ``busy()`` is false and
    ``base`` when true (``base``: its size at start unless given). ``cores``: the cores this process's threads run
    on while the servers compute and while they idle, as a pair (None: the affinity is left alone). ``stop()``
    puts back the pool size and the affinity found at start. ``switches`` counts the pool's changes (tests, logs)."""

    def __init__(self, busy: Callable[[], bool], extra: int, base: int | None = None,
                 cores: tuple[set[int], set[int]] | None = None) -> None:
        if extra < 0:
            raise ValueError(f"extra threads must be >= 0, got {extra}")
        self.busy, self.extra, self.cores = busy, extra, cores
        self.found = self.current = torch.get_num_threads()
        self.base = self.found if base is None else base
        self.found_cores = process_cores() if cores else None
        self.idle: bool | None = None  # what the servers did at the last check
        self.owner: int | None = None
        self.switches = 0
        self._handles: list = []

    def start(self) -> BorrowedThreads:
        self.owner = threading.get_ident()
        self._handles = [module_hooks.register_module_forward_pre_hook(self._before_forward),
                         module_hooks.register_module_forward_hook(self._after_forward)]
        self.check()
        return self

    def stop(self) -> None:
        """Hooks removed, the pool and the affinity as found at start (on the starting thread; else the pool at its
        next forward)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if threading.get_ident() == self.owner and self.current != self.found:
            torch.set_num_threads(self.found)
            self.current = self.found
        if self.found_cores:
            bind_process(self.found_cores)

    def __enter__(self) -> BorrowedThreads:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def check(self) -> None:
        """Size the pool (and bind the threads) for what the servers do now (on the starting thread only)."""
        if threading.get_ident() != self.owner:
            return
        idle = not self.busy()
        wanted = self.base + self.extra if idle else self.base
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted
            self.switches += 1
        if self.cores and idle != self.idle:
            bind_process(self.cores[idle])
        self.idle = idle

    def _before_forward(self, module, args) -> None:
        self.check()

    def _after_forward(self, module, args, output) -> None:
        first = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(first, torch.Tensor) and first.requires_grad:
            first.register_hook(self._on_gradient)  # the backward reaches this module: look again

    def _on_gradient(self, grad: torch.Tensor) -> None:
        self.check()


def process_cores() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no binding
        return None


def bind_process(cores: set[int]) -> None:
    """Every thread of this process on ``cores`` (a thread keeps its own affinity: each is set; one that ended
    meanwhile is skipped). Linux only: elsewhere nothing changes."""
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return
    for tid in threads:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.sched_setaffinity(int(tid), cores)
