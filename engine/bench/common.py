"""What every scenario shares: the model, its data, interleaved timing, summaries and counters.

Shared machines are noisy, so every comparison runs its variants interleaved (A, B, A, B, ...) and reports the
median, the range and the median of the per-round ratios; absolute times are only comparable within one run.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping

import accel_backends

from ..tiny_model import tiny_qwen2
from .collective_counter import CollectiveCounter

# The long-response case (--grpo-case long, the scaling scenario): the model make-tiny-model writes with these
# settings, and the work around it.
LONG_CASE_MODEL = {"hidden_size": 128, "layers": 4, "vocab_size": 2048, "eos_bias": 0.33, "single_eos": True}
LONG_CASE_WORK = ["train.prompts_per_step=16", "rollout.n=8", "rollout.max_new_tokens=128"]


def model_factory(options: Mapping, layers: int | None = None) -> Callable:
    """A zero-argument factory of a randomly initialised Qwen2 of the benchmark's size (nothing downloaded)."""

    def build():
        return tiny_qwen2(seed=0, vocab_size=options["vocab"], hidden_size=options["hidden"],
                          intermediate_size=options.get("intermediate"), layers=layers or options["layers"],
                          heads=options.get("heads", 4), kv_heads=options.get("kv_heads", 2),
                          max_positions=options["seq"] * 4)

    return build


def micro_batches(options: Mapping, rank: int, count: int) -> list:
    """``count`` micro-batches of random token ids, different on each rank (data parallelism)."""
    import torch

    g = torch.Generator().manual_seed(rank)
    shape = (options["batch"], options["seq"])
    return [torch.randint(0, options["vocab"], shape, generator=g) for _ in range(count)]


def lm_loss(module, ids):
    """The step function of the training scenarios: next-token loss, weighted by tokens."""
    ids = ids.to(next(module.parameters()).device)
    return module(input_ids=ids, labels=ids).loss, ids.numel()


def timed(fn: Callable[[], object], synchronize: Callable[[], None] | None = None) -> float:
    """Seconds ``fn()`` took, waiting for the device to finish when ``synchronize`` is given."""
    start = time.perf_counter()
    fn()
    if synchronize is not None:
        synchronize()
    return time.perf_counter() - start


def interleave(variants: Mapping[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run each variant once per round, in turn (A, B, A, B...); each call returns its own sample in seconds."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, sample in variants.items():
            samples[name].append(sample())
    return samples


def summary(samples: list[float], scale: float = 1e3) -> dict:
    """Median, min and max (in ms by default) and the sample count."""
    return {"median_ms": statistics.median(samples) * scale, "min_ms": min(samples) * scale,
            "max_ms": max(samples) * scale, "n": len(samples)}


def ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over rounds of the per-round ratio of two interleaved variants.

    Each round runs both variants back to back, so a round's ratio sees the same machine load on both sides;
    the median over rounds then drops the rounds another process disturbed. Steadier than a ratio of medians.
    """
    return statistics.median(a / max(b, 1e-12) for a, b in zip(numerator, denominator, strict=True))


class CommCounter(CollectiveCounter):
    """``CollectiveCounter`` that also adds up the bytes of each collective.

    A collective's size is its largest tensor argument: the gathered output of an all-gather, the unreduced input
    of a reduce-scatter, the buffer of an all-reduce (the payload before sharding, the same on every rank).
    """

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def _wrap(self, kind: str, original):
        counted = super()._wrap(kind, original)

        def with_bytes(*args, **kwargs):
            if self._depth == 0:
                self.bytes += _largest_tensor_bytes(list(args) + list(kwargs.values()))
            return counted(*args, **kwargs)

        return with_bytes

    def as_dict(self) -> dict:
        return {"all_gather": self.counts.get("all_gather", 0),
                "reduce_scatter": self.counts.get("reduce_scatter", 0),
                "all_reduce": self.counts.get("all_reduce", 0), "bytes": self.bytes}


def _largest_tensor_bytes(values) -> int:
    import torch

    largest = 0
    for value in values:
        tensors = value if isinstance(value, (list, tuple)) else [value]
        for tensor in tensors:
            if torch.is_tensor(tensor):
                largest = max(largest, tensor.numel() * tensor.element_size())
    return largest


class TransferLog:
    """An observer plugin (the engine's ``on_transfer`` event) that counts moves and bytes while registered."""

    def __init__(self) -> None:
        self.moves = 0
        self.bytes = 0

    def reset(self) -> None:
        self.moves = self.bytes = 0

    def __enter__(self) -> TransferLog:
        accel_backends.register_plugin(self, name=f"bench-transfer-log-{id(self)}")
        return self

    def __exit__(self, *exc) -> None:
        accel_backends.unregister_plugin(self)

    @accel_backends.hookimpl
    def on_transfer(self, engine, what, destination, num_bytes):
        self.moves += 1
        self.bytes += int(num_bytes)


def peak_memory(backend, fn: Callable[[], object]) -> int | None:
    """The backend's peak allocated bytes while ``fn()`` runs (on the CPU: the process's peak RSS)."""
    backend.reset_peak_memory_stats()
    fn()
    return backend.memory_stats().peak_allocated


def release(backend) -> None:
    """Free the engines a finished scenario built (FSDP modules hold reference cycles) before the next one.

    Between scenarios only, never inside a timed region: on a GPU a 0.5B model's engines would otherwise pile up.
    """
    gc.collect()
    backend.empty_cache()
