"""Tokenized items (``masks.Tokenized``: ids and a loss mask) as the model inputs of a micro-batch, packed in one row
or padded (``engine.packing``), with each scored token's mask in the layout's target order."""

from __future__ import annotations

import dataclasses

import torch

from ..packing import SequenceBatch, build_layout
from .masks import Tokenized


@dataclasses.dataclass
class MicroBatch:
    layout: object  # engine.packing.Layout
    mask: torch.Tensor  # [T] float: 1 where the layout's target token is supervised


def sequence_batch(items: list[Tokenized]) -> tuple[SequenceBatch, torch.Tensor]:
    """The items right-padded, each scored from its first supervised token (>= 1), and their masks ``[N, W]``."""
    width = max(len(item.ids) for item in items)
    tokens = torch.zeros(len(items), width, dtype=torch.long)
    masks = torch.zeros(len(items), width, dtype=torch.float32)
    starts = []
    for row, item in enumerate(items):
        tokens[row, :len(item.ids)] = torch.tensor(item.ids)
        masks[row, :len(item.mask)] = torch.tensor(item.mask, dtype=torch.float32)
        masks[row, 0] = 0.0
        starts.append(next(i for i, m in enumerate(item.mask) if m and i))
    lengths = torch.tensor([len(item.ids) for item in items], dtype=torch.long)
    return SequenceBatch(tokens, lengths, torch.tensor(starts, dtype=torch.long)), masks


def micro_batch(batch: SequenceBatch, masks: torch.Tensor, indices, packed: bool) -> MicroBatch:
    """Sequences ``indices`` of ``batch`` as one micro-batch (none: a filler whose one token weighs nothing)."""
    layout = build_layout(batch, indices, packed)
    if layout.filler:
        return MicroBatch(layout, torch.zeros(len(layout.targets)))
    chosen = torch.tensor(list(indices), dtype=torch.long)[layout.rows]
    return MicroBatch(layout, masks[chosen, batch.starts[chosen] + layout.columns])
