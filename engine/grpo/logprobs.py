"""Log-probabilities (and entropy) of the response tokens, without a full-vocabulary fp32 tensor per token.

A naive ``log_softmax(logits.float() / temperature)`` over ``[batch, prompt + response, vocab]`` holds the
logits, their fp32/temperature copy and the log-softmax at once: with Qwen's 151,936-token vocabulary, 8
sequences of 256 response tokens are 1.2 GB per copy. Here the model's output layer itself is replaced, for the
duration of the forward, by one that turns one slice of response positions at a time into logits and reduces
them to the chosen token's log-probability (and entropy): no ``[B, R, V]`` tensor exists at all. With gradients
each slice is recomputed in the backward pass instead of being kept (activation checkpointing of the slice).
Models whose logits are not a plain linear layer of the hidden states (soft-capping, scaling) get their logits at
the response positions only (``logits_to_keep``) and the same slice-by-slice reduction.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint

ROWS_PER_SLICE = 256  # positions (of all rows together) per log-softmax slice: 256 x 151,936 x 4 B = 156 MB


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
    flat_logits, flat_targets = logits.flatten(0, 1), targets.reshape(-1)  # slices over all positions, not per row
    for start in range(0, flat_targets.numel(), ROWS_PER_SLICE):
        chunk, chosen = flat_logits[start:start + ROWS_PER_SLICE], flat_targets[start:start + ROWS_PER_SLICE]
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


def _plain_output_layer(module):
    """The model's output ``nn.Linear`` when logits are exactly ``hidden @ weight.T (+ bias)``; else ``None``."""
    get = getattr(module, "get_output_embeddings", None)
    head = get() if callable(get) else None
    config = getattr(module, "config", None)
    changes_logits = any(getattr(config, key, None) for key in ("final_logit_softcapping", "logit_scale"))
    return head if type(head) is torch.nn.Linear and not changes_logits else None


def _head_log_probs(hidden, weight, bias, targets, temperature):
    return _chosen_log_probs(torch.nn.functional.linear(hidden, weight, bias), targets, temperature)


@contextlib.contextmanager
def _fused_output_layer(head, targets: torch.Tensor, temperature: float, with_entropy: bool, entropy_out: list):
    """Within the block the output layer returns the chosen tokens' log-probs ``[B, R]`` instead of logits.

    It runs inside the model's own forward (so a sharded model has its weights gathered, and its backward hooks
    see the result), computing logits for one slice of positions at a time. With gradients each slice is
    recomputed in the backward pass: only the hidden states, which exist anyway, are kept.
    """
    def forward(hidden):
        # The last position predicts a token after the response. Slices run over the positions of all rows
        # together: one slice per ROWS_PER_SLICE positions, not one per sequence (fewer, larger kernels).
        hidden = hidden[:, :-1].flatten(0, 1)
        flat_targets = targets.reshape(-1)
        pieces, entropies = [], []
        for start in range(0, flat_targets.numel(), ROWS_PER_SLICE):
            h, chosen = hidden[start:start + ROWS_PER_SLICE], flat_targets[start:start + ROWS_PER_SLICE]
            if torch.is_grad_enabled() and (h.requires_grad or head.weight.requires_grad):
                pieces.append(checkpoint(_head_log_probs, h, head.weight, head.bias, chosen, temperature,
                                         use_reentrant=False))
            else:
                pieces.append(_head_log_probs(h, head.weight, head.bias, chosen, temperature))
            if with_entropy:
                with torch.no_grad():
                    entropies.append(_entropy(torch.nn.functional.linear(h, head.weight, head.bias), temperature))
        if with_entropy:
            entropy_out.append(torch.cat(entropies).view(targets.shape))
        # A new tensor, not a view: FSDP hooks the model's outputs for backward.
        return torch.cat(pieces).view(targets.shape).clone()

    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # back to the class's forward


def response_log_probs(module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                       temperature: float, with_entropy: bool = False):
    """Log-probs ``[B, R]`` of the response tokens under ``module`` (and their entropy when asked).

    Prompts are left-padded and responses right-padded, so the response occupies the last ``R`` positions and
    their logits come from the ``R + 1`` last positions but one: the model computes only those
    (``logits_to_keep``), and a plain linear output layer computes them slice by slice.
    """
    response_length = input_ids.size(1) - prompt_length
    targets = input_ids[:, prompt_length:]
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids(attention_mask),
              "logits_to_keep": response_length + 1}
    head = _plain_output_layer(module)
    if head is not None:
        entropy_out: list = []
        with _fused_output_layer(head, targets, temperature, with_entropy, entropy_out):
            log_probs = module(**kwargs).logits
        entropy = entropy_out[0] if with_entropy else None
    else:
        logits = module(**kwargs).logits
        log_probs, entropy = token_log_probs(logits[:, :-1], targets, temperature, with_entropy)
    return (log_probs, entropy) if with_entropy else log_probs
