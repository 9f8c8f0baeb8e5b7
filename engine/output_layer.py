"""The model's output layer, for trainers that turn hidden states into logits themselves, a chunk of positions at
a time, so that no full-vocabulary tensor exists for a whole micro-batch (GRPO's log-probs, SFT's loss): finding a
plain output layer, replacing its forward for one model call, and the one chunked loop both losses run."""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

ROWS_PER_CHUNK: int | None = None  # positions per chunk for every caller; None: each caller's logit budget decides

Chunk = tuple[torch.Tensor, "torch.Tensor | None"]


def plain_output_layer(module):
    """The model's output ``nn.Linear`` when logits are exactly ``hidden @ weight.T (+ bias)``; else ``None``."""
    get = getattr(module, "get_output_embeddings", None)
    head = get() if callable(get) else None
    config = getattr(module, "config", None)
    changes_logits = any(getattr(config, key, None) for key in ("final_logit_softcapping", "logit_scale"))
    return head if type(head) is torch.nn.Linear and not changes_logits else None


@contextlib.contextmanager
def replaced_forward(head: torch.nn.Module, forward):
    """Within the block ``head`` runs ``forward(hidden)`` instead of its own: inside the model's forward, so a
    sharded model has the head's weights gathered and its backward hooks see the result."""
    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # back to the class's forward


def rows_per_chunk(vocab_size: int, logits_per_chunk: int) -> int:
    """Positions per chunk: ``ROWS_PER_CHUNK`` if set, else as many as ``logits_per_chunk`` allows for the
    vocabulary (a small vocabulary needs few chunks; the memory of one chunk is bounded either way)."""
    return ROWS_PER_CHUNK or max(1, logits_per_chunk // vocab_size)


def in_chunks(compute: Callable[[torch.Tensor, torch.Tensor, bool], Chunk], inputs: torch.Tensor,
              targets: torch.Tensor, rows: int, needs_grad: bool, with_side: bool,
              side_apart: bool = False) -> Chunk:
    """``compute(inputs_chunk, targets_chunk, with_side) -> (values, side values or None)`` over ``rows`` positions
    at a time, each part concatenated (``targets`` flat, ``inputs`` one row per target).

    With gradients and more than one chunk each chunk is checkpointed: recomputed in the backward pass, keeping
    only its inputs, so one chunk's logits exist at a time. ``side_apart``: the side values (e.g. an entropy that
    needs no gradient) of such a chunk come from a separate no-grad pass, so the recompute never repeats them;
    otherwise they are computed with the values (inside the checkpoint). A single chunk is kept as is, in one pass,
    as checkpointing it would not lower the peak and would compute it twice.
    """
    starts = range(0, targets.numel(), rows)
    recompute = needs_grad and torch.is_grad_enabled() and len(starts) > 1
    values, sides = [], []
    for start in starts:
        part, chosen = inputs[start:start + rows], targets[start:start + rows]
        if recompute and (side_apart or not with_side):
            value = checkpoint(lambda p, c: compute(p, c, False)[0], part, chosen, use_reentrant=False)
            side = None
            if with_side:
                with torch.no_grad():
                    side = compute(part, chosen, True)[1]
        elif recompute:
            value, side = checkpoint(lambda p, c: compute(p, c, True), part, chosen, use_reentrant=False)
        else:
            value, side = compute(part, chosen, with_side)
        values.append(value)
        sides.append(side)
    return torch.cat(values), (torch.cat(sides) if with_side else None)
