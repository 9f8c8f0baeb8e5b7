"""Mode switch: what entering ``train_mode`` costs, with nothing offloaded and with each offload option.

* Fast path against the pre-fix behaviour (a model move "to the device", ``gc.collect()`` and ``empty_cache()``
  on every entry), at 2 and 28 decoder layers: the fast path must not grow with the model.
* Parameter offload, optimizer offload and both: time of an enter+exit round trip, bytes moved, moves per entry,
  bandwidth.
* Optimizer onload ``"step"`` (state on the device only inside ``optimizer_step``) against ``"mode"``.
"""

from __future__ import annotations

import gc

from .. import FSDPEngine
from ..fsdp.offload import move_model
from .common import TransferLog, interleave, lm_loss, micro_batches, model_factory, ratio, release, summary, timed

FAST_SWITCHES_PER_SAMPLE = 200  # one fast switch is microseconds: time a batch of them per sample
OFFLOAD_VARIANTS = {
    "param_offload": {"param_offload": True},
    "optimizer_offload": {"optimizer_offload": True},
    "both": {"param_offload": True, "optimizer_offload": True},
}


def legacy_enter(engine) -> None:
    """What entering train mode cost before the fix, with nothing offloaded: a model move, gc and cache flush."""
    move_model(engine.module, engine.fsdp_version, engine.backend, "device")
    gc.collect()
    engine.backend.empty_cache()
    engine.module.train()


class _CallCounter:
    """Counts calls of ``gc.collect`` and the backend's ``empty_cache`` while active (the fast path makes none)."""

    def __init__(self, backend) -> None:
        self.backend, self.gc_collect, self.empty_cache = backend, 0, 0

    def __enter__(self):
        self._collect, self._empty = gc.collect, self.backend.empty_cache

        def collect(*args):
            self.gc_collect += 1
            return self._collect(*args)

        def empty():
            self.empty_cache += 1
            return self._empty()

        gc.collect, self.backend.empty_cache = collect, empty
        return self

    def __exit__(self, *exc):
        gc.collect = self._collect
        del self.backend.empty_cache  # back to the class's method


def _train_once(engine, batches) -> None:
    with engine.train_mode():
        engine.forward_backward_batch(batches, lm_loss)
        engine.optimizer_step()


def fast_against_legacy(options, backend, layers: int) -> dict:
    engine = FSDPEngine(model_factory(options, layers), _base_config(options), backend)
    counter = _CallCounter(backend)

    def fast() -> float:
        def many():
            for _ in range(FAST_SWITCHES_PER_SAMPLE):
                with engine.train_mode():
                    pass

        with counter:
            return timed(many) / FAST_SWITCHES_PER_SAMPLE

    samples = interleave({"fast_path": fast, "legacy": lambda: timed(lambda: legacy_enter(engine))},
                         options["switches"])
    result = {name: summary(values) for name, values in samples.items()}
    result.update(layers=layers, sharded_units=engine.num_sharded_units,
                  legacy_over_fast=ratio(samples["legacy"], samples["fast_path"]),
                  fast_path_calls={"gc_collect": counter.gc_collect, "empty_cache": counter.empty_cache,
                                   "switches": FAST_SWITCHES_PER_SAMPLE * options["switches"]})
    return result


def _base_config(options, **extra):
    from .. import EngineConfig

    return EngineConfig(fsdp_version=options["fsdp_version"], lr=1e-4,
                        mixed_precision=options["mixed_precision"], **extra)


def offload_round_trips(options, backend, rank) -> dict:
    """Enter+exit ``train_mode`` for each offload option, interleaved; optimizer state exists (one step done)."""
    factory = model_factory(options)
    batches = micro_batches(options, rank, 1)
    engines = {name: FSDPEngine(factory, _base_config(options, **cfg), backend)
               for name, cfg in OFFLOAD_VARIANTS.items()}
    for engine in engines.values():
        _train_once(engine, batches)
    moves = {name: {"moves_per_enter": 0, "bytes_per_round_trip": 0} for name in engines}

    def round_trip(name):
        engine = engines[name]

        def sample() -> float:
            with TransferLog() as log:
                def enter_exit():
                    with engine.train_mode():
                        moves[name]["moves_per_enter"] = log.moves
                seconds = timed(enter_exit, backend.synchronize)
            moves[name]["bytes_per_round_trip"] = log.bytes
            return seconds

        return sample

    samples = interleave({name: round_trip(name) for name in engines}, options["switches"])
    result = {}
    for name, values in samples.items():
        row = {**summary(values), **moves[name]}
        row["bandwidth_gb_s"] = row["bytes_per_round_trip"] / max(row["median_ms"] / 1e3, 1e-12) / 1e9
        result[name] = row
    return result


def optimizer_onload(options, backend, rank) -> dict:
    """Optimizer state offloaded: onload for the whole ``train_mode`` (``"mode"``) or only for the step."""
    factory = model_factory(options)
    batches = micro_batches(options, rank, 2)
    engines = {onload: FSDPEngine(factory, _base_config(options, optimizer_offload=True, optimizer_onload=onload),
                                  backend)
               for onload in ("mode", "step")}
    for engine in engines.values():
        _train_once(engine, batches)
    seen = {name: {} for name in engines}

    def step(name):
        engine = engines[name]

        def sample() -> float:
            def work():
                with engine.train_mode():
                    seen[name]["residency_during_forward_backward"] = engine.residency()
                    engine.forward_backward_batch(batches, lm_loss)
                    engine.optimizer_step()
                    seen[name]["residency_after_step"] = engine.residency()

            with TransferLog() as log:
                backend.reset_peak_memory_stats()
                seconds = timed(work, backend.synchronize)
                seen[name]["peak_memory_bytes"] = backend.memory_stats().peak_allocated
            seen[name].update(moves_per_step=log.moves, bytes_moved_per_step=log.bytes)
            return seconds

        return sample

    samples = interleave({name: step(name) for name in engines}, options["steps"])
    result = {}
    for name, values in samples.items():
        result[name] = {**summary(values), **seen[name]}
    result["step_over_mode_time"] = ratio(samples["step"], samples["mode"])
    return result


def run(options, backend, rank) -> dict:
    result = {}
    for layers in options["switch_layers"]:
        result[f"layers_{layers}"] = fast_against_legacy(options, backend, layers)
        release(backend)
    result["offload"] = offload_round_trips(options, backend, rank)
    release(backend)
    result["optimizer_onload"] = optimizer_onload(options, backend, rank)
    return result

