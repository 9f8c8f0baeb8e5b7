"""Sampling ahead of the trainer, within a staleness bound (``rollout.max_staleness`` = k > 0).

One ``SamplerThread`` per trainer rank produces the step batches of steps ``start .. stop - 1`` in order, while the
trainer trains. It begins the batch of step ``s`` only once the trainer's weights are at version ``>= s - k``
(version: the updates the pushed weights have had; ``published`` after every push), so a batch trained at step
``t`` was begun with weights at most ``k`` versions old: the bound holds by construction and no sampled work is
thrown away (the thread waits rather than drops). ``produce(step)`` must make no collective call (HTTP only): the
trainer's main thread owns every collective (the weight push gathers FSDP units on every rank).

Shutdown: ``close()`` (normal end, an error, a stop at a safe point) makes the thread leave at its next check and
waits a bounded time for it; an error inside ``produce`` (a dead server) is kept and raised by ``take`` on the
trainer's thread, naming what failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

POLL_S = 0.5  # how often a waiting side looks again for a stop or a dead thread


class SamplerThread:
    """Produces ``produce(step)`` for ``start <= step < stop``, at most ``max_staleness`` versions ahead of
    ``version`` (the trainer's, at start). ``clock`` is the time source of the busy intervals (a test's own)."""

    def __init__(self, produce: Callable[[int], Any], start: int, stop: int, max_staleness: int, version: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.produce, self.start_step, self.stop_step = produce, start, stop
        self.max_staleness, self.version, self.clock = max_staleness, version, clock
        self.ready: dict[int, tuple[Any, int]] = {}  # step -> (batch, the trainer's version when it was begun)
        self.busy: list[tuple[float, float]] = []  # (begin, end) of each produce(), for the busy fraction
        self.producing_since: float | None = None  # when the produce() running now began
        self.error: BaseException | None = None
        self.stopping = False
        self.condition = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="accel-sampler", daemon=True)

    # -- the thread ---------------------------------------------------------------------------------------------

    def start(self) -> SamplerThread:
        self.thread.start()
        return self

    def _run(self) -> None:
        for step in range(self.start_step, self.stop_step):
            with self.condition:
                while not self.stopping and self.version < step - self.max_staleness:
                    self.condition.wait(POLL_S)
                if self.stopping:
                    return
                begun_at = self.version
                began = self.producing_since = self.clock()
            try:
                batch = self.produce(step)
            except BaseException as exc:  # noqa: BLE001 - raised again by take() on the trainer's thread
                with self.condition:
                    self.error, self.producing_since = exc, None
                    self.condition.notify_all()
                return
            with self.condition:
                self.ready[step] = (batch, begun_at)
                self.busy.append((began, self.clock()))
                self.producing_since = None
                self.condition.notify_all()

    # -- the trainer's side -------------------------------------------------------------------------------------

    def published(self, version: int) -> None:
        """The trainer's weights are now at ``version`` on every server (a push finished)."""
        with self.condition:
            self.version = version
            self.condition.notify_all()

    def take(self, step: int) -> tuple[Any, int, float]:
        """``(batch, version it was begun at, seconds waited)`` for ``step``; raises the thread's error."""
        waited_from = time.perf_counter()
        with self.condition:
            while step not in self.ready:
                if self.error is not None:
                    raise self.error
                if not self.thread.is_alive():
                    raise RuntimeError(f"the sampler thread ended without producing step {step + 1}'s batch")
                self.condition.wait(POLL_S)
            batch, begun_at = self.ready.pop(step)
        return batch, begun_at, time.perf_counter() - waited_from

    def busy_seconds(self, since: float, until: float) -> float:
        """Seconds ``produce`` ran between ``since`` and ``until`` (clock time), a run still going included;
        intervals that end before ``until`` are forgotten (the next window starts there)."""
        with self.condition:
            spans = self.busy + ([(self.producing_since, until)] if self.producing_since is not None else [])
            total = sum(max(0.0, min(end, until) - max(begin, since)) for begin, end in spans)
            self.busy = [span for span in self.busy if span[1] > until]
        return total

    def close(self, timeout_s: float = 10.0) -> bool:
        """Ask the thread to stop and wait at most ``timeout_s``; whether it ended (a request in flight to a
        server that is gone ends when the server is stopped)."""
        with self.condition:
            self.stopping = True
            self.condition.notify_all()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout_s)
        return not self.thread.is_alive()
