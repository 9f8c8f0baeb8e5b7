"""An RL run with ``rollout.max_staleness`` = k > 0: the step batches are sampled ahead by a thread per rank, against
vLLM servers (``rollout.vllm.mode=server``), while the trainer trains (``engine/rollout/sampling_ahead.py``).

The thread draws the step's prompts and samples them over HTTP only, seeded from its own generator (per rank and
step, as the synchronous step's); scoring, advantages and every collective stay on the trainer's thread. The
trainer numbers its weights by the updates they had (the step count): after step ``t``'s update it pushes version
``t + 1`` and tells the thread, which begins step ``s``'s batch only once the version is ``>= s - k``. At
consumption every sample's oldest token version is checked again; a group with a sample older than the bound (a
server restarted with other weights: its label was never pushed) is dropped, whole, and counted.
"""

from __future__ import annotations

import threading

from ..rollout.sampling_ahead import SamplerThread
from ..rollout.staleness import VersionRecorder, row_versions, stale_groups, staleness_figures


def staleness_problems(config) -> list[str]:
    """``rollout.max_staleness`` and ``rollout.partial``'s problems, as sentences."""
    r, problems = config.rollout, []
    bound = r.max_staleness
    if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
        return [f"rollout.max_staleness must be an integer >= 0 (0: synchronous), got {bound!r}"]
    if not isinstance(r.partial, bool):
        problems.append(f"rollout.partial must be true or false, got {r.partial!r}")
    if bound == 0:
        return problems
    mode = getattr(r.vllm, "mode", "colocate")
    if r.engine != "vllm" or mode != "server":
        problems.append(f"rollout.max_staleness={bound} needs rollout.engine=vllm with rollout.vllm.mode=server "
                        f"(sampling in separate servers while the trainer trains); this run has rollout.engine="
                        f"{r.engine}" + (f" with rollout.vllm.mode={mode}" if r.engine == "vllm" else "") +
                        ": set rollout.max_staleness=0 or use vLLM servers")
    if getattr(config.algorithm, "filter_groups", False):  # GRPO's dynamic sampling
        problems.append(f"algorithm.filter_groups (dynamic sampling: every rank draws again until the step's groups "
                        f"are found, agreed through collectives) needs rollout.max_staleness=0, got {bound}")
    if r.tools or r.environment:
        problems.append(f"multi-turn rollouts (rollout.tools / rollout.environment: the ranks' turns agree through "
                        f"collectives) need rollout.max_staleness=0, got {bound}")
    return problems


class AheadSampling:
    """The trainer's side of sampling ahead: the thread, the label -> version table, the checks at consumption.
    ``trainer``: an ``RLTrainer`` (its task, sampler, sampling settings, rollout engine and seeds)."""

    def __init__(self, trainer, bound: int) -> None:
        self.trainer, self.bound = trainer, bound
        self.versions: dict[str, int] = {}  # a push's label (what the servers report) -> the trainer's version
        self.thread: SamplerThread | None = None
        # A fast tokenizer must not be used by two threads at once: the thread's sampling and the trainer's
        # validation (the only other user while the thread runs) take turns.
        self.tokenizer_lock = threading.Lock()

    def start(self, start: int, stop: int) -> None:
        """Start sampling steps ``start .. stop - 1`` with the servers' weights at version ``start`` (pushed)."""
        self.versions[self.trainer.rollout_engine.weight_version] = start
        self.thread = SamplerThread(self.produce, start, stop, self.bound, version=start).start()

    def produce(self, step: int):
        """Step ``step``'s samples, batch and weight-version spans (run by the thread: HTTP only)."""
        t = self.trainer
        generator = t.generator(step)
        with self.tokenizer_lock:
            samples = t.task.sample(t.prompts_per_rank, generator)
            recorder = VersionRecorder(t.rollout_engine, generator)
            batch = t.sampler(recorder, samples, t.sampling)
        return samples, batch, recorder.spans

    def take(self, step: int):
        """``((samples, batch), dropped [B] bool, sums, maxima, seconds waited)`` for step ``step``."""
        (samples, batch, spans), begun_at, waited = self.thread.take(step)
        oldest, _ = row_versions(spans, self.versions, default=begun_at)
        dropped = stale_groups(oldest, step, self.bound, self.trainer.config.rollout.n)
        sums, maxima = staleness_figures(oldest, step, dropped, batch.response_mask.sum(dim=1))
        return (samples, batch), dropped, sums, maxima, waited

    def pushed(self, version: int) -> float:
        """The policy after ``version`` updates is on every server: record its label, let the thread go on.
        Returns the seconds the push waited for requests in flight to finish (pause mode ``wait``): the trainer
        waiting for samples too."""
        engine = self.trainer.rollout_engine
        self.versions[engine.weight_version] = version
        self.thread.published(version)
        return engine.pusher.pause_s if self.trainer.rank == 0 else 0.0

    def busy_seconds(self, since: float, until: float) -> float:
        return self.thread.busy_seconds(since, until)

    def sampling(self) -> bool:
        """Whether the thread has requests in flight to the servers now."""
        return self.thread is not None and self.thread.producing_since is not None

    def close(self) -> None:
        if self.thread is not None:
            self.thread.close()
