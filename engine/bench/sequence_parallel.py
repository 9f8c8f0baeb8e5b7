"""Sequence parallelism: one long sequence's forward and backward at sp=1 (each rank holds all its tokens) and
sp=2 (two ranks share it, each holding half), interleaved: time, the exchange's share of it, memory per rank.

Per token length of ``--sp-tokens``, one packed sequence (every token after the first scored) runs through
``engine.sequence_parallel`` (``split_layout``, ``slice_log_probs``, ``token_mean_share``) on two engines over the
same ranks: ``sp1`` (FSDP over every rank, each rank its own sequence) and ``sp2`` (groups of 2 share one
sequence). Memory per rank is counted two ways: the bytes autograd keeps for the backward pass (activations; a
count, the same on any machine) and the backend's peak above the memory in use before the pass (on the CPU the
process's resident memory, freed heap handed back first; on a GPU the allocator's peak). The exchange's cost is
the time spent inside the backend's ``all_to_all`` (4 per attention layer forward, 4 in its backward), and its
bytes per rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import time

import torch
import torch.distributed as dist

from .. import EngineConfig, FSDPEngine
from ..packing import SequenceBatch, build_layout
from ..sequence_parallel import slice_log_probs, split_layout, token_mean_share
from .common import interleave, model_factory, ratio, summary
from .packing import SavedActivations


class ExchangeTimer:
    """Time and bytes inside ``backend.all_to_all`` while open (the instance's method wrapped, then restored)."""

    def __init__(self, backend) -> None:
        self.backend, self.seconds, self.bytes, self.calls = backend, 0.0, 0, 0

    def __enter__(self) -> ExchangeTimer:
        original = self.backend.all_to_all

        def timed(output, input, group=None):
            start = time.perf_counter()
            original(output, input, group)
            self.backend.synchronize()
            self.seconds += time.perf_counter() - start
            self.bytes += input.numel() * input.element_size()
            self.calls += 1

        self.backend.all_to_all = timed
        return self

    def __exit__(self, *exc) -> None:
        del self.backend.all_to_all  # back to the class's method


def _hand_back_freed_memory() -> None:
    """Collect, and return freed heap pages to the system (glibc), so a resident-memory peak starts clean."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _one_sequence(tokens: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    batch = SequenceBatch(torch.randint(0, vocab, (1, tokens), generator=g), torch.tensor([tokens]),
                          torch.tensor([1]))
    return build_layout(batch, [0], packed=True)


def _step(module, layout, sp):
    piece = split_layout(layout, sp).to(next(module.parameters()).device)
    log_probs, _ = slice_log_probs(module, piece)
    return token_mean_share(-log_probs, piece), layout.targets.numel()


def _pass(engine, layout, backend) -> dict:
    """One forward/backward (no optimizer step): seconds, exchange seconds and bytes, activations, peak."""
    _hand_back_freed_memory()
    backend.reset_peak_memory_stats()
    start_bytes = backend.memory_stats().allocated or 0
    saved = []

    def step(module, micro):
        with SavedActivations(module) as counter:
            result = _step(module, micro, engine.sequence_parallel)
        saved.append(counter.bytes)
        return result

    with ExchangeTimer(backend) as exchange, engine.train_mode():
        start = time.perf_counter()
        engine.forward_backward_batch([layout], step)
        backend.synchronize()
        seconds = time.perf_counter() - start
        peak = backend.memory_stats().peak_allocated
        engine.zero_grad()
    return {"seconds": seconds, "exchange_seconds": exchange.seconds, "exchange_bytes": exchange.bytes,
            "exchanges": exchange.calls, "activation_bytes": saved[0],
            "peak_above_start_bytes": None if peak is None else peak - start_bytes}


def run(options, backend, rank) -> dict:
    world = dist.get_world_size()
    if world % 2:
        return {"skipped": f"sp=2 needs an even number of ranks, this run has {world}: use --nproc 2"}
    factory = model_factory({**options, "seq": max(options["sp_tokens"])})
    engines = {f"sp{size}": FSDPEngine(factory, EngineConfig(sequence_parallel_size=size, grad_sync="deferred",
                                                             mixed_precision=options["mixed_precision"]), backend)
               for size in (1, 2)}
    result = {"world_size": world, "model": {k: options[k] for k in ("hidden", "layers", "heads", "kv_heads",
                                                                      "vocab")}, "tokens": {}}
    for tokens in options["sp_tokens"]:
        # sp1: each rank its own sequence; sp2: each group of two ranks one sequence (seeded by the group).
        layouts = {"sp1": _one_sequence(tokens, options["vocab"], rank),
                   "sp2": _one_sequence(tokens, options["vocab"], rank // 2)}
        rows: dict[str, list[dict]] = {name: [] for name in engines}

        def sample(name, rows=rows, layouts=layouts):
            row = _pass(engines[name], layouts[name], backend)
            rows[name].append(row)
            return row["seconds"]

        samples = interleave({name: (lambda n=name: sample(n)) for name in engines}, options["sp_repeats"])
        per = {}
        for name, values in rows.items():
            last = values[-1]
            per[name] = {**summary(samples[name]), "exchange": summary([v["exchange_seconds"] for v in values]),
                         "exchange_share": sum(v["exchange_seconds"] for v in values) / sum(samples[name]),
                         "exchange_mib": last["exchange_bytes"] / 2**20, "exchanges": last["exchanges"],
                         "activation_mib": last["activation_bytes"] / 2**20,
                         "peak_above_start_mib": (None if last["peak_above_start_bytes"] is None
                                                  else max(v["peak_above_start_bytes"] for v in values) / 2**20)}
        peaks = [per[n]["peak_above_start_mib"] for n in ("sp2", "sp1")]
        per["sp2_over_sp1"] = {"time": ratio(samples["sp2"], samples["sp1"]),
                               "activations": per["sp2"]["activation_mib"] / per["sp1"]["activation_mib"],
                               "peak": peaks[0] / peaks[1] if None not in peaks and peaks[1] else None}
        result["tokens"][str(tokens)] = per
    return result
