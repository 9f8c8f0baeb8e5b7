"""The model's output layer, for trainers that turn hidden states into logits themselves, a slice of positions at
a time, so that no full-vocabulary tensor exists for a whole micro-batch (GRPO's log-probs, SFT's loss)."""

from __future__ import annotations

import contextlib

import torch


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
