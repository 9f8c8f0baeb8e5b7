"""The report card's ``host-reads`` property: how often an update's forward and backward make the host read a value
from the device, which stalls the host until the device's queue reaches it.

A GPU or NPU stays busy only while the host queues work ahead of it; a read per micro-batch or per attention layer
(a loss's ``.item()``, a mask's ``if tensor.any():``, a packed row's sequence starts read back in every layer)
makes the device idle once each time. The engine's update reads its figures once, after the last micro-batch's
forward (one metric reduction), so the count must not change with the number of micro-batches or of layers.
Counted by ``accel_backends.testing.host_reads`` (on a host backend every read in the block counts: an upper bound).
"""

from __future__ import annotations

import functools

import torch

from accel_backends import DeviceBackend
from accel_backends.testing.certify import Measurement
from accel_backends.testing.host_reads import count_host_reads

from .tiny_model import UNEVEN, tiny_qwen2

VOCAB = UNEVEN["vocab_size"]
SHAPES = ((2, 2), (4, 2), (2, 4))  # (micro-batches, layers) compared


def _layouts(rank: int, count: int) -> list:
    """``count`` packed micro-batches of this rank's sequences (two or three sequences each)."""
    from .packing import SequenceBatch, build_layout

    generator = torch.Generator().manual_seed(400 + rank)
    sizes = [(3, 6), (5, 2), (2, 9), (4, 4), (6, 3), (3, 7), (2, 5), (5, 8)]
    batch = SequenceBatch.from_parts([torch.randint(0, VOCAB, (p,), generator=generator) for p, _ in sizes],
                                     [torch.randint(0, VOCAB, (r,), generator=generator) for _, r in sizes])
    per = len(sizes) // count
    return [build_layout(batch, list(range(i * per, (i + 1) * per)), packed=True) for i in range(count)]


def packed_loss(module, layout):
    """Next-token cross-entropy of a packed micro-batch, its token count, and its accuracy left on the device."""
    device = next(module.parameters()).device
    layout = layout.to(device)
    out = module(**layout.inputs, logits_to_keep=layout.logits_to_keep, use_cache=False)
    logits = layout.select(out.logits.float())
    accuracy = (logits.detach().argmax(-1) == layout.targets).float().mean()
    return torch.nn.functional.cross_entropy(logits, layout.targets), len(layout.targets), {"accuracy": accuracy}


def check_host_reads(backend: DeviceBackend, nproc: int) -> Measurement:
    """The reads of an update's forward and backward over packed micro-batches: the same with 2 or 4 micro-batches
    and with 2 or 4 layers."""
    import torch.distributed as dist

    from . import EngineConfig, FSDPEngine

    rank, counts, places = dist.get_rank(), {}, {}
    for layers in sorted({layers for _, layers in SHAPES}):
        model = functools.partial(tiny_qwen2, seed=0, max_positions=32, layers=layers, **UNEVEN)
        engine = FSDPEngine(model, EngineConfig(fsdp_version=2, mixed_precision="fp32"), backend=backend)
        for micro, _ in [shape for shape in SHAPES if shape[1] == layers]:
            layouts = _layouts(rank, micro)  # planned on the host, before the update
            with engine.train_mode():
                with count_host_reads(backend) as reads:
                    engine.forward_backward_batch(layouts, packed_loss)
                engine.optimizer_step()
            counts[(micro, layers)], places[(micro, layers)] = reads.count, reads.where
    figure = counts[SHAPES[1]]
    same = len(set(counts.values())) == 1
    described = ", ".join(f"{m} micro-batches x {n} layers: {c}" for (m, n), c in counts.items())
    if same:
        return Measurement(float(figure), "reads per update", True, f"{described} (packed rows, forward and "
                           "backward, the metric reduction)")
    grown = max(counts, key=counts.get)
    where = ", ".join(f"{place} x{n}" for place, n in places[grown].most_common(3))
    return Measurement(float(counts[grown]), "reads per update", False, f"{described}; most at {where}")
