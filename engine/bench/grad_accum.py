"""Gradient accumulation: micro-batch counts x FSDP1/FSDP2 x gradient-sync modes, plus the engine's own choice.

For each FSDP version and micro-batch count the sync modes run interleaved. Each row gives step time, the
collectives of one whole step (forward/backward of every micro-batch and the optimizer step) counted, the bytes
they carry, and the backend's peak memory during a step.
"""

from __future__ import annotations

from .. import EngineConfig, FSDPEngine
from .common import CommCounter, interleave, lm_loss, micro_batches, model_factory, ratio, release, summary, timed

SYNC_MODES = {
    "every_micro_batch": {"grad_sync": "every_micro_batch"},
    "deferred": {"grad_sync": "deferred"},
    "deferred_unsharded": {"grad_sync": "deferred", "keep_params_unsharded": True},
}


def modes_for(fsdp_version: int) -> dict:
    """keep_params_unsharded is an FSDP2 option."""
    return {k: v for k, v in SYNC_MODES.items() if fsdp_version == 2 or "unsharded" not in k}


def train_step(engine, batches) -> None:
    with engine.train_mode():
        engine.forward_backward_batch(batches, lm_loss)
        engine.optimizer_step()


def _one_version(options, backend, rank, fsdp_version: int) -> dict:
    factory = model_factory(options)
    engines = {mode: FSDPEngine(factory, EngineConfig(fsdp_version=fsdp_version, lr=1e-4,
                                                      mixed_precision=options["mixed_precision"], **cfg), backend)
               for mode, cfg in modes_for(fsdp_version).items()}
    by_count = {}
    for count in options["micro_batch_counts"]:
        batches = micro_batches(options, rank, count)
        rows = {}
        for mode, engine in engines.items():
            train_step(engine, batches)  # warm-up
            with CommCounter() as comm:
                backend.reset_peak_memory_stats()
                train_step(engine, batches)
                peak = backend.memory_stats().peak_allocated
            rows[mode] = {"collectives": comm.as_dict(), "peak_memory_bytes": peak}
        samples = interleave({mode: (lambda e=engine, b=batches: timed(lambda: train_step(e, b), backend.synchronize))
                              for mode, engine in engines.items()}, options["steps"])
        for mode, values in samples.items():
            rows[mode].update(summary(values))
        for mode in rows:
            rows[mode]["time_vs_every_micro_batch"] = ratio(samples[mode], samples["every_micro_batch"])
        by_count[str(count)] = rows
    units = next(iter(engines.values())).num_sharded_units
    return {"sharded_units": units, "micro_batches": by_count}


def sync_decision(options, backend) -> dict:
    """What ``grad_sync="auto"`` chose here, and the plan behind it (``engine.grad_sync_plan``)."""
    config = EngineConfig(fsdp_version=2, lr=1e-4, mixed_precision=options["mixed_precision"], grad_sync="auto")
    engine = FSDPEngine(model_factory(options), config, backend)
    return {"grad_sync_mode": engine.grad_sync_mode, "grad_sync_plan": engine.grad_sync_plan.as_dict()}


def run(options, backend, rank) -> dict:
    result = {}
    for version in options["fsdp_versions"]:
        result[f"fsdp{version}"] = _one_version(options, backend, rank, version)
        release(backend)
    result["decision"] = sync_decision(options, backend)
    return result
