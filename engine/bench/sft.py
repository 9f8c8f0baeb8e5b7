"""SFT steps (``accel-sft``'s loss and batching): one global batch of sequences of varied lengths (half of each
supervised), split into 8 micro-batches per rank, run interleaved as

* ``packed_deferred``: packed micro-batches, gradients synced once per step (the default);
* ``packed_every_micro_batch``: the same micro-batches, gradients synced after each;
* ``padded_deferred``: padded micro-batches of the same sequences (the fallback path);

with step time, supervised tokens per second, pad tokens and MFU (``perf/mfu`` of the median step; none where the
backend knows no peak); then, for each token budget
(``train.micro_batch_tokens``: the packing budgets), the activation bytes autograd keeps for the largest
micro-batch (a count, the same on any machine: what a budget bounds) and the backend's peak memory of the step.
"""

from __future__ import annotations

import math

from .. import EngineConfig, FSDPEngine
from ..offline.masks import Tokenized
from ..offline.objectives.sft.batches import rank_micro_batches
from ..offline.objectives.sft.trainer import token_loss
from ..runtime import supervised_perf
from .common import interleave, model_factory, ratio, release, summary, timed
from .packing import SavedActivations

MICRO_BATCHES = 8  # per rank


def sft_items(options, world_size: int) -> list[Tokenized]:
    """``MICRO_BATCHES x 2`` sequences per rank, lengths spread over 8 .. 4 x seq, the second half of each trained."""
    import torch

    g = torch.Generator().manual_seed(0)
    count = MICRO_BATCHES * 2 * world_size
    lengths = torch.randint(8, 4 * options["seq"] + 1, (count,), generator=g).tolist()
    items = []
    for index, length in enumerate(lengths):
        ids = torch.randint(0, options["vocab"], (length,), generator=g).tolist()
        items.append(Tokenized(ids, [0] * (length // 2) + [1] * (length - length // 2), f"bench:{index}"))
    return items


def run(options, backend, rank) -> dict:
    import torch
    import torch.distributed as dist

    world_size = dist.get_world_size()
    items = sft_items(options, world_size)
    device = backend.device()
    factory = model_factory(options)
    base = {"fsdp_version": 2, "lr": 1e-4, "mixed_precision": options["mixed_precision"]}
    engines = {"deferred": FSDPEngine(factory, EngineConfig(grad_sync="deferred", **base), backend),
               "every_micro_batch": FSDPEngine(factory, EngineConfig(grad_sync="every_micro_batch", **base), backend)}
    packed = engines["deferred"].packed_input_supported()
    per_micro = math.ceil(len(items) / (world_size * MICRO_BATCHES))

    def plan(packed_layout: bool, budget: int | None = None):
        return rank_micro_batches(items, rank, world_size, micro_batch_tokens=budget, micro_batch_size=per_micro,
                                  packed=packed_layout)

    def step(engine, micro) -> dict:
        with engine.train_mode():
            metrics = engine.forward_backward_batch(micro, lambda module, m: token_loss(module, m, device))
            engine.optimizer_step()
        return metrics

    variants = {"packed_deferred": (engines["deferred"], plan(packed)),
                "packed_every_micro_batch": (engines["every_micro_batch"], plan(packed)),
                "padded_deferred": (engines["deferred"], plan(False))}
    rows = {}
    for name, (engine, (micro, figures)) in variants.items():
        metrics = step(engine, micro)  # warm-up; its token count is the step's
        rows[name] = {"micro_batches_per_rank": len(micro), "supervised_tokens": metrics["weight"],
                      "pad_tokens_this_rank": figures["pad_tokens"]}
    samples = interleave({name: (lambda e=engine, m=micro: timed(lambda: step(e, m), backend.synchronize))
                          for name, (engine, (micro, _)) in variants.items()}, options["steps"])
    for name, values in samples.items():
        rows[name].update(summary(values))
        rows[name]["supervised_tokens_per_s"] = rows[name]["supervised_tokens"] / (rows[name]["median_ms"] / 1e3)
        perf = supervised_perf(variants[name][0], [len(i.ids) for i in items], rows[name]["median_ms"] / 1e3)
        rows[name]["mfu"] = perf.get("perf/mfu")
    result = {"world_size": world_size, "sequences": len(items), "packed_path": packed,
              "tokens": sum(len(i.ids) for i in items), "variants": rows,
              "deferred_over_every_micro_batch": ratio(samples["packed_deferred"], samples["packed_every_micro_batch"]),
              "packed_over_padded": ratio(samples["packed_deferred"], samples["padded_deferred"])}
    longest, budgets = max(len(i.ids) for i in items), {}
    for budget in options["packing_budgets"]:
        if budget < longest:
            budgets[str(budget)] = {"skipped": f"below the longest sequence ({longest} tokens)"}
            continue
        micro, _ = rank_micro_batches(items, rank, world_size, micro_batch_tokens=budget, micro_batch_size=per_micro,
                                      packed=packed)
        sizes: list[int] = []

        def measured(module, m, sizes=sizes):
            with SavedActivations(module) as saved:
                result = token_loss(module, m, device)
            sizes.append(saved.bytes)
            return result

        engine = engines["deferred"]
        backend.reset_peak_memory_stats()
        with engine.train_mode():
            engine.forward_backward_batch(micro, measured)
            engine.optimizer_step()
        figures = torch.tensor([float(max(sizes)), float(backend.memory_stats().peak_allocated or 0)],
                               device=backend.metrics_device())
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        budgets[str(budget)] = {"micro_batches_per_rank": len(micro), "activation_mib": figures[0].item() / 2**20,
                                "peak_memory_bytes": figures[1].item()}
    result["peak_by_budget"] = budgets
    release(backend)
    return result
