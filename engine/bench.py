"""``accel-bench``: the two engine fixes, measured side by side in one run on the selected backend.

1. Mode switch: entering ``train_mode`` with nothing offloaded (the fast path) against the old behaviour of
   moving the model "to the device" and running ``gc.collect()`` and ``empty_cache()`` on every entry.
2. Step time and collective counts by gradient-sync mode: every micro-batch, deferred, and deferred with FSDP2
   parameters kept unsharded between micro-batches.

Timings are interleaved (A, B, A, B...) and reported as medians and ratios, because shared machines are noisy.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

SYNC_MODES = {
    "every_micro_batch": {"grad_sync": "every_micro_batch"},
    "deferred": {"grad_sync": "deferred"},
    "deferred_kept_unsharded": {"grad_sync": "deferred", "keep_params_unsharded": True},
}


def _model_factory(options):
    def build():
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(0)
        return Qwen2ForCausalLM(Qwen2Config(
            vocab_size=options["vocab"], hidden_size=options["hidden"], intermediate_size=options["hidden"] * 2,
            num_hidden_layers=options["layers"], num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=options["seq"] * 2))

    return build


def _micro_batches(options, rank):
    import torch

    g = torch.Generator().manual_seed(rank)
    shape = (options["batch"], options["seq"])
    return [torch.randint(0, options["vocab"], shape, generator=g) for _ in range(options["micro_batches"])]


def _lm_loss(module, ids):
    ids = ids.to(next(module.parameters()).device)
    return module(input_ids=ids, labels=ids).loss, ids.numel()


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _legacy_enter(engine):
    """What entering train mode used to cost with nothing offloaded: a model move, gc and cache flush."""
    from .offload import move_model

    move_model(engine.module, engine.config.fsdp_version, engine.backend, "device")
    gc.collect()
    engine.backend.empty_cache()
    engine.module.train()


def _fast_enter(engine):
    with engine.train_mode():
        pass


def worker(options):
    import accel_backends

    from . import EngineConfig, FSDPEngine
    from .collectives import CollectiveCounter

    backend = accel_backends.get_backend()
    factory = _model_factory(options)
    modes = {k: v for k, v in SYNC_MODES.items() if options["fsdp_version"] == 2 or "kept" not in k}
    engines = {mode: FSDPEngine(factory, EngineConfig(fsdp_version=options["fsdp_version"], lr=1e-4, **cfg))
               for mode, cfg in modes.items()}
    rank = engines["deferred"].rank
    batches = _micro_batches(options, rank)

    # 1. mode switch
    engine = engines["deferred"]
    calls = {"gc_collect": 0}
    original_collect = gc.collect

    def counting_collect(*args):
        calls["gc_collect"] += 1
        return original_collect(*args)

    switch = {"fast_path": [], "legacy": []}
    for _ in range(options["switches"]):
        gc.collect = counting_collect
        switch["fast_path"].append(_time(lambda: _fast_enter(engine)))
        fast_calls = calls["gc_collect"]
        gc.collect = original_collect
        switch["legacy"].append(_time(lambda: _legacy_enter(engine)))
        assert fast_calls == 0, "the fast path called gc.collect()"

    # 2. steps by sync mode (after one warm-up step each)
    def step(mode):
        eng = engines[mode]
        with eng.train_mode():
            eng.forward_backward_batch(batches, _lm_loss)
            eng.optimizer_step()
        backend.synchronize()

    counts = {}
    for mode in modes:
        step(mode)
        with engines[mode].train_mode(), CollectiveCounter() as counter:
            engines[mode].forward_backward_batch(batches, _lm_loss)
        engines[mode].zero_grad()
        counts[mode] = dict(counter.counts)
    step_times = {mode: [] for mode in modes}
    for _ in range(options["steps"]):
        for mode in modes:
            step_times[mode].append(_time(lambda: step(mode)))

    def summary(samples):
        return {"median_ms": statistics.median(samples) * 1e3, "min_ms": min(samples) * 1e3, "n": len(samples)}

    result = {
        "backend": backend.name,
        "world_size": engine.world_size,
        "options": options,
        "sharded_units": engine.num_sharded_units,
        "mode_switch": {k: summary(v) for k, v in switch.items()},
        "step": {mode: {**summary(v), "collectives": counts[mode]} for mode, v in step_times.items()},
    }
    result["mode_switch"]["legacy_over_fast"] = (
        result["mode_switch"]["legacy"]["median_ms"] / max(result["mode_switch"]["fast_path"]["median_ms"], 1e-9))
    base = result["step"]["every_micro_batch"]["median_ms"]
    for mode in modes:
        result["step"][mode]["time_vs_every_micro_batch"] = result["step"][mode]["median_ms"] / base
    return result


def _print(result) -> None:
    ms = result["mode_switch"]
    print(f"backend {result['backend']}, {result['world_size']} rank(s), FSDP{result['options']['fsdp_version']}, "
          f"{result['sharded_units']} sharded units, {result['options']['micro_batches']} micro-batches")
    print(f"mode switch (train_mode enter+exit, nothing offloaded): fast path {ms['fast_path']['median_ms']:.3f} ms,"
          f" old behaviour {ms['legacy']['median_ms']:.1f} ms ({ms['legacy_over_fast']:.0f}x)")
    print(f"{'grad sync':26} {'step ms':>9} {'vs every':>9} {'all-gathers':>12} {'reduce-scatters':>16}")
    for mode, row in result["step"].items():
        c = row["collectives"]
        print(f"{mode:26} {row['median_ms']:9.1f} {row['time_vs_every_micro_batch']:9.2f} "
              f"{c.get('all_gather', 0):12d} {c.get('reduce_scatter', 0):16d}")


def main(argv=None) -> int:
    from .launch import WorkerFailed, run

    parser = argparse.ArgumentParser(prog="accel-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2, help="worker processes (ignored under torchrun)")
    parser.add_argument("--fsdp-version", type=int, choices=(1, 2), default=2)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2, help="sequences per micro-batch")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per sync mode")
    parser.add_argument("--switches", type=int, default=10, help="timed mode switches per variant")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    options = {k: v for k, v in vars(args).items() if k not in ("nproc", "json")}
    try:
        result = run(worker, args.nproc, options)
    except WorkerFailed as exc:
        print(f"accel-bench: {exc}", file=sys.stderr)
        return 1
    _print(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
