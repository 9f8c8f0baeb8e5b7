"""Log-probabilities (and entropy) of the response tokens, without a full-vocabulary fp32 tensor per token.

A naive ``log_softmax(logits.float() / temperature)`` over ``[batch, prompt + response, vocab]`` holds the
logits, their fp32/temperature copy and the log-softmax at once: with Qwen's 151,936-token vocabulary, 8
sequences of 256 response tokens are 1.2 GB per copy. Here the model returns logits only at the response
positions (``logits_to_keep``), and the log-softmax is reduced to the chosen token's log-probability one slice
of positions at a time, so the extra memory is one slice, not the whole batch. With gradients, each slice is
recomputed in the backward pass instead of being kept (activation checkpointing of the slice).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

ROWS_PER_SLICE = 256  # response positions per log-softmax slice: 256 x 151,936 x 4 bytes = 156 MB at most


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` used them."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def _chosen_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = logits.float() / temperature
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


@torch.no_grad()
def _entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = logits.float() / temperature
    log_z = torch.logsumexp(scaled, dim=-1, keepdim=True)
    return (log_z.squeeze(-1) - (torch.softmax(scaled, dim=-1) * scaled).sum(-1))


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chosen-token log-probs ``[B, R]`` (float32) of ``logits`` ``[B, R, V]``; optionally the entropy (no grad).

    Equal to ``log_softmax(logits.float() / temperature).gather(targets)``, computed slice by slice.
    """
    pieces, entropies = [], []
    for row in range(logits.size(0)):  # slices are views: no copy of the logits is made
        for start in range(0, logits.size(1), ROWS_PER_SLICE):
            chunk, chosen = logits[row, start:start + ROWS_PER_SLICE], targets[row, start:start + ROWS_PER_SLICE]
            if torch.is_grad_enabled() and chunk.requires_grad:
                # Keep only the (already existing) logits slice for backward; recompute the softmax there.
                piece = checkpoint(_chosen_log_probs, chunk, chosen, temperature, use_reentrant=False)
            else:
                piece = _chosen_log_probs(chunk, chosen, temperature)
            pieces.append(piece)
            if with_entropy:
                entropies.append(_entropy(chunk.detach(), temperature))
    log_probs = torch.cat(pieces).view(targets.shape)
    entropy = torch.cat(entropies).view(targets.shape) if with_entropy else None
    return log_probs, entropy


def response_log_probs(module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                       temperature: float, with_entropy: bool = False):
    """Log-probs ``[B, R]`` of the response tokens under ``module`` (and their entropy when asked).

    Prompts are left-padded and responses right-padded, so the response occupies the last ``R`` positions and
    their logits come from the ``R + 1`` last positions but one: the model computes only those.
    """
    response_length = input_ids.size(1) - prompt_length
    logits = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                    logits_to_keep=response_length + 1).logits
    log_probs, entropy = token_log_probs(logits[:, :-1], input_ids[:, prompt_length:], temperature, with_entropy)
    return (log_probs, entropy) if with_entropy else log_probs
