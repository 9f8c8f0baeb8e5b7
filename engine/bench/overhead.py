"""Engine overhead: ``FSDPEngine``'s training step against a minimal hand-written FSDP2 loop.

Both sides get the same model, micro-batches, AdamW settings, clipping, deferred gradient sync and sharding (one
unit per decoder layer plus the root). The hand-written loop is what a careful user would write without the
engine; the ratio of medians is what the engine's bookkeeping (token weighting, metrics, events) costs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import EngineConfig, FSDPEngine
from .common import interleave, micro_batches, model_factory, ratio, summary, timed
from .grad_accum import train_step

LR, MAX_GRAD_NORM = 1e-4, 1.0


class HandWrittenFSDP2:
    """The loop a user would write: fully_shard per decoder layer and root, no-sync on all but the last."""

    def __init__(self, factory, backend, dtype: torch.dtype) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = factory()
        mesh = init_device_mesh(backend.device_type, (dist.get_world_size(),))
        kwargs = {"mesh": mesh}
        if dtype != torch.float32:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        layer_names = set(model._no_split_modules or ())
        for module in model.modules():
            if type(module).__name__ in layer_names:
                fully_shard(module, **kwargs)
        self.model = fully_shard(model, **kwargs)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.device = backend.device()

    def step(self, batches) -> None:
        self.model.train()
        count = len(batches)
        for index, ids in enumerate(batches):
            self.model.set_requires_gradient_sync(index == count - 1)
            ids = ids.to(self.device)
            (self.model(input_ids=ids, labels=ids).loss / count).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM, foreach=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def run(options, backend, rank) -> dict:
    from ..fsdp.sharding import compute_dtype

    factory = model_factory(options)
    config = EngineConfig(fsdp_version=2, lr=LR, max_grad_norm=MAX_GRAD_NORM, grad_sync="deferred",
                          mixed_precision=options["mixed_precision"])
    engine = FSDPEngine(factory, config, backend)
    hand = HandWrittenFSDP2(factory, backend, compute_dtype(config, backend))
    batches = micro_batches(options, rank, options["micro_batches"])
    variants = {"engine": lambda: timed(lambda: train_step(engine, batches), backend.synchronize),
                "hand_written": lambda: timed(lambda: hand.step(batches), backend.synchronize)}
    for sample in variants.values():
        sample()  # warm-up
    samples = interleave(variants, options["steps"])
    result = {name: summary(values) for name, values in samples.items()}
    result["micro_batches"] = options["micro_batches"]
    result["engine_over_hand_written"] = ratio(samples["engine"], samples["hand_written"])
    return result
