"""Per-token results of one rank's slice, and the group's loss made of them.

Each rank runs the model on its slice (``split_layout``); the attention exchanges make every token's hidden state
that of the whole sequence. A recipe computes its per-token values on the slice (``slice_log_probs`` below, or
its own chunked output-layer functions, which take a ``LayoutSlice`` as they take a ``Layout``), turns them into
its rank's share of the micro-batch loss (normalisers from the whole layout: ``group_tokens``,
``scored_lengths``), and returns ``(share, weight)`` with the micro-batch's weight: ``FSDPEngine`` counts that
weight once per group.
"""

from __future__ import annotations

import torch


def slice_log_probs(module, piece, temperature: float = 1.0, with_entropy: bool = False):
    """Log-probs ``[T]`` of the slice's own scored tokens (``piece.targets``) under ``module`` and, when asked,
    their entropy (no gradient), fp32. ``piece`` is a ``LayoutSlice`` (or a whole ``Layout`` when the group is
    one rank) on the module's device. Logits exist only at the slice's scored positions (``logits_to_keep``); a
    recipe that needs them a chunk at a time passes the slice to its chunked output-layer function instead."""
    logits = piece.select(module(**piece.inputs, logits_to_keep=piece.logits_to_keep, use_cache=False).logits)
    scores = logits.float() / temperature
    log_z = torch.logsumexp(scores, dim=-1)
    log_probs = scores.gather(-1, piece.targets.to(scores.device).unsqueeze(-1)).squeeze(-1) - log_z
    if not with_entropy:
        return log_probs, None
    with torch.no_grad():
        entropy = log_z - (torch.softmax(scores, dim=-1) * scores).sum(-1)
    return log_probs, entropy


def token_mean_share(values: torch.Tensor, piece) -> torch.Tensor:
    """This rank's share of the mean of per-token ``values`` ``[T]`` over the micro-batch's scored tokens: the
    shares of the group's ranks add up to the mean of the unsplit micro-batch (a rank with no own token adds a
    zero that still carries its backward through the exchanges)."""
    owned = getattr(piece, "owned", None)
    total = getattr(piece, "group_tokens", values.numel())
    if owned is not None and owned.numel() == 0:
        return values.sum() * 0.0
    return values.sum() / max(total, 1)
