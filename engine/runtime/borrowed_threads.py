"""Borrowing the cores of idle inference servers: a wider intra-op thread pool while nobody else computes.

An inference server on the trainer's own CPU cores (``rollout.vllm.mode=server`` on one host) idles between its
batches, while the trainer, given one thread per core it owns, leaves the server's cores empty. ``BorrowedThreads``
gives the trainer's compute thread ``base + extra`` intra-op threads whenever ``busy()`` says no request is in
flight, and ``base`` otherwise, so the two never share a core. It looks again before every module's forward and,
in the backward pass, when each module output's gradient arrives: a switch waits at most one module's work, not a
whole micro-batch's.

torch's thread count belongs to the thread that sets it (OpenMP's setting is per thread), so only the thread that
started the borrowing switches; a hook that fires on another thread leaves the pool as it is.
"""

from __future__ import annotations

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
    ``base`` (its size at start) when true. ``switches`` counts the changes (for tests and logs)."""

    def __init__(self, busy: Callable[[], bool], extra: int) -> None:
        if extra < 0:
            raise ValueError(f"extra threads must be >= 0, got {extra}")
        self.busy, self.extra = busy, extra
        self.base = self.current = torch.get_num_threads()
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
        """Hooks removed, the pool back at its size at start (on the starting thread; else at its next forward)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if threading.get_ident() == self.owner and self.current != self.base:
            torch.set_num_threads(self.base)
            self.current = self.base

    def __enter__(self) -> BorrowedThreads:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def check(self) -> None:
        """Size the pool for what the servers do now (on the starting thread only)."""
        if threading.get_ident() != self.owner:
            return
        wanted = self.base if self.busy() else self.base + self.extra
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted
            self.switches += 1

    def _before_forward(self, module, args) -> None:
        self.check()

    def _after_forward(self, module, args, output) -> None:
        first = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(first, torch.Tensor) and first.requires_grad:
            first.register_hook(self._on_gradient)  # the backward reaches this module: look again

    def _on_gradient(self, grad: torch.Tensor) -> None:
        self.check()
