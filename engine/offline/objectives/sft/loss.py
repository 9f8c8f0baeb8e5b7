"""The SFT loss (token-weighted cross-entropy) and token accuracy of a micro-batch, without full-vocabulary
logits for the whole micro-batch.

``F.cross_entropy(logits.float())`` over every scored position holds ``[T, V]`` fp32 logits and, in the backward
pass, their gradient: 16,384 tokens of Qwen's 151,936-token vocabulary are 10 GB each. Here the model's output
layer is replaced, for the duration of the forward, by one that turns ``rows_per_chunk`` scored positions at a
time into logits and reduces them to each token's cross-entropy and whether it was the top prediction. With
gradients and several chunks each chunk is recomputed in the backward pass (activation checkpointing), so only
one chunk's logits (and their gradient) exist at any time. Models whose logits are not a plain linear layer of
the hidden states get logits at the scored positions only (``logits_to_keep``) and the same chunked reduction.
The values are those of the unchunked computation (tests/unit/test_sft_loss.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .... import output_layer
from ....output_layer import plain_output_layer, replaced_forward

CHUNK_LOGITS = 512 * 151_936  # logits per chunk: 512 positions of Qwen's vocabulary, 311 MB in fp32


def rows_per_chunk(vocab_size: int) -> int:
    """Positions per chunk (``output_layer.rows_per_chunk``): 512 with Qwen's vocabulary;
    ``engine.output_layer.ROWS_PER_CHUNK`` overrides it."""
    return output_layer.rows_per_chunk(vocab_size, CHUNK_LOGITS)


def _reduce(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cross-entropy (fp32, differentiable) and top-1 hits (no grad) of one chunk of logits."""
    logits = logits.float()
    return F.cross_entropy(logits, targets, reduction="none"), logits.detach().argmax(-1) == targets


def _in_chunks(compute, inputs: torch.Tensor, targets: torch.Tensor, vocab_size: int, needs_grad: bool):
    """``compute(inputs_chunk, targets_chunk)`` over ``rows_per_chunk(vocab_size)`` rows at a time
    (``output_layer.in_chunks``; the hits are computed with the losses, inside a checkpointed chunk)."""
    return output_layer.in_chunks(lambda part, chosen, _: compute(part, chosen), inputs, targets,
                                  rows_per_chunk(vocab_size), needs_grad, with_side=True)


def per_token_losses(module, layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy ``[T]`` (fp32) of ``layout.targets`` under ``module`` and whether each was the model's top
    prediction ``[T]`` (bool), from one forward whose logits exist one chunk at a time."""
    kwargs = {**layout.inputs, "logits_to_keep": layout.logits_to_keep, "use_cache": False}
    head = plain_output_layer(module)
    if head is None:
        logits = layout.select(module(**kwargs).logits)
        return _in_chunks(_reduce, logits, layout.targets, logits.size(-1), logits.requires_grad)
    hits_out: list = []

    def compute(hidden, chosen):
        return _reduce(F.linear(hidden, head.weight, head.bias), chosen)

    def forward(hidden):
        needs_grad = hidden.requires_grad or head.weight.requires_grad
        losses, hits = _in_chunks(compute, layout.select(hidden), layout.targets, head.weight.size(0), needs_grad)
        hits_out.append(hits)
        return losses.clone()  # a new tensor, not a view: FSDP hooks the model's outputs for backward

    with replaced_forward(head, forward):
        losses = module(**kwargs).logits
    return losses, hits_out[0]
