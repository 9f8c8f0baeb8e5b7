"""``ulysses``: the attention function registered with transformers for sequence-parallel models.

A model loaded with ``attn_implementation="ulysses"`` calls it in every attention layer with query ``[B, H, S/sp,
D]`` and key/value ``[B, Hkv, S/sp, D]`` (RoPE applied from the slice's own positions). In a split forward (the
model was given ``sequence_parallel=SplitForward(...)`` among its inputs, which transformers hands to every
attention call, recomputed forwards of gradient checkpointing included) it exchanges heads for tokens, attends
whole sequences for ``H/sp`` heads, and exchanges back to ``[B, S/sp, H, D]``. Key/value heads that the group does
not divide are repeated just enough (grouped-query attention with fewer KV heads than ranks).

transformers builds no mask for a registered name, and a slice's positions cannot tell its sequences apart anyway:
which tokens may attend to which comes from the whole micro-batch's ``position_ids`` (a sequence runs while
positions rise by one; causal within it), so packed rows, right- and left-padded rows all come out exact. A packed
row is attended sequence by sequence (``engine.packing``'s ``packed_sdpa``: no ``S x S`` mask); rows whose
positions never restart (one sequence, right padding) are plain causal sdpa on the exchanged tensors (no copy);
only several rows that restart (left padding) build a mask.

Without ``sequence_parallel`` among the inputs (generation, the packing probe, any whole-sequence forward) the
function is ``packed_sdpa``, masks included: rollouts see whole sequences.
"""

from __future__ import annotations

import math
import types

import torch

from ..packing.attention import _packed_row_mask, packed_sdpa_forward
from .exchange import exchange

ULYSSES = "ulysses"
HEADS, TOKENS = 1, 2  # axes of query/key/value [B, H, S, D]
OUT_TOKENS, OUT_HEADS = 1, 2  # axes of an attention output [B, S, H, D]


class SplitForward:
    """What a split forward's attention layers need: the group, and the positions of the whole micro-batch
    ``[B, S]`` (S: every rank's slice, in rank order). Passed to the model as ``sequence_parallel=``."""

    def __init__(self, sp, positions: torch.Tensor) -> None:
        self.sp, self.positions = sp, positions

    def to(self, device) -> SplitForward:
        return SplitForward(self.sp, self.positions.to(device))


def segments(positions: torch.Tensor) -> torch.Tensor | None:
    """``[B, S]`` sequence index of each token (a new sequence wherever the position does not rise by one), or
    ``None`` when no row restarts (then plain causal attention is exact)."""
    restarts = positions[:, 1:] != positions[:, :-1] + 1
    if not bool(restarts.any()):
        return None
    return torch.nn.functional.pad(restarts.long().cumsum(-1), (1, 0))


def _local_attention(module, query, key, value, positions, kwargs):
    """Causal attention within each sequence of whole rows, for this rank's heads; returns ``[B, S, h, D]``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seq = segments(positions)
    if seq is not None and query.size(0) == 1:  # a packed row: sequence by sequence, no mask
        marker = torch.empty(1, 1, 0, 0, dtype=torch.bool, device=query.device)
        return packed_sdpa_forward(module, query, key, value, marker, position_ids=positions, **kwargs)[0]
    mask = None  # no row restarts: plain causal attention
    if seq is not None:
        order = torch.arange(seq.size(1), device=seq.device)
        mask = (seq.unsqueeze(2) == seq.unsqueeze(1)) & (order.unsqueeze(1) >= order.unsqueeze(0))
        mask = mask.unsqueeze(1)  # [B, 1, S, S]
    return sdpa_attention_forward(module, query, key, value, mask, is_causal=mask is None, **kwargs)[0]


def ulysses_attention_forward(module, query, key, value, attention_mask, sequence_parallel=None, **kwargs):
    """The registered function: see the module docstring."""
    if sequence_parallel is None:
        return packed_sdpa_forward(module, query, key, value, attention_mask, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise RuntimeError("sequence parallelism cannot split a sliding-window attention layer: use "
                           "engine.sequence_parallel_size=1 for this model")
    sp = sequence_parallel.sp
    kv_heads = key.size(HEADS)
    repeat = sp.size // math.gcd(kv_heads, sp.size)  # divides H / Hkv whenever sp divides H
    if repeat > 1:
        key, value = key.repeat_interleave(repeat, HEADS), value.repeat_interleave(repeat, HEADS)
    query, key, value = (exchange(x, HEADS, TOKENS, sp) for x in (query, key, value))
    # These heads only: the grouped-query ratio of the local heads, causal (the model's attention is).
    local = types.SimpleNamespace(num_key_value_groups=query.size(HEADS) // key.size(HEADS), is_causal=True)
    kwargs.pop("position_ids", None)
    kwargs.pop("is_causal", None)
    out = _local_attention(local, query, key, value, sequence_parallel.positions.to(query.device), kwargs)
    return exchange(out, OUT_TOKENS, OUT_HEADS, sp), None


def register_ulysses() -> str:
    """Register ``ulysses`` (function and, for whole-sequence forwards, packed_sdpa's masks); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ULYSSES, ulysses_attention_forward)
    AttentionMaskInterface.register(ULYSSES, _packed_row_mask)
    return ULYSSES
