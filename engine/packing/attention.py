"""``packed_sdpa``: transformers' sdpa attention, except that a packed row is attended one sequence at a time.

For a packed row (one row, ``position_ids`` restarting at 0 for each sequence, no mask) transformers gives ``sdpa``
a block-diagonal causal mask over the whole row: building it and attending under it both cost the square of the
row's length, not the sum of the squares of its sequences' lengths. On a CPU, a row of 16 sequences of about 80
tokens made an update 1.8x slower than padded rows (``docs/perf.md``); at 8,000 tokens the mask alone is 64 MB
and takes 0.7 s per forward. Flash-attention kernels take the sequence boundaries instead.

``packed_sdpa`` behaves exactly as ``sdpa`` (same masks, same kernel) for every input but a packed row: there its
mask function builds no mask but an empty marker, and the attention function, seeing the marker, finds the
sequences (the starts ``build_layout`` computed on the host and tagged ``position_ids`` with, so no layer reads
them back from the device; else from ``position_ids`` themselves) and runs causal sdpa on them, in groups of
similar length padded to the group's longest (one kernel call per group; a group's attention work stays within
twice what its sequences need, so many short sequences cost a few calls, and a long one is not padded with short
ones). Anything else (padding masks, generation with a cache, a plain row, sliding-window layers, which keep their
mask) goes to transformers' sdpa as it is. The engine loads models with it where the backend prefers ``sdpa``.
"""

from __future__ import annotations

import functools

import torch

PACKED_SDPA = "packed_sdpa"
PADDED_WORK = 2.0  # a group's attention work (sequences x longest^2) at most this times its sequences' own
STARTS_TAG = "packed_sequence_starts"  # the attribute of a packed row's position_ids holding its sequences' starts


def _is_marker(mask) -> bool:
    return isinstance(mask, torch.Tensor) and mask.numel() == 0


def _packed_row_mask(*args, attention_mask=None, allow_is_causal_skip=True, local_size=None, use_vmap=False,
                     **kwargs):
    """sdpa's mask, but an empty marker for a packed row: transformers refuses the causal skip only there when
    there is no padding mask, no sliding window and no extra mask function (the row's sequences are then known
    from ``position_ids``)."""
    from transformers.masking_utils import sdpa_mask

    batch_size = kwargs.get("batch_size", args[0] if args else None)
    q_length = kwargs.get("q_length", args[1] if len(args) > 1 else None)
    if attention_mask is None and not allow_is_causal_skip and local_size is None and not use_vmap \
            and batch_size == 1 and q_length and q_length > 1:
        return torch.empty(1, 1, 0, 0, dtype=torch.bool, device=kwargs.get("device", "cpu"))
    return sdpa_mask(*args, attention_mask=attention_mask, allow_is_causal_skip=allow_is_causal_skip,
                     local_size=local_size, use_vmap=use_vmap, **kwargs)


def tag_sequence_starts(position_ids: torch.Tensor, starts) -> torch.Tensor:
    """Tag a packed row's ``position_ids`` with where its sequences start (host integers, known when the row was
    built): attention layers and transformers' packed-row check take them from the tag instead of reading the
    positions back from the device, which would stall it once per layer. Returns ``position_ids``."""
    setattr(position_ids, STARTS_TAG, tuple(int(start) for start in starts))
    return position_ids


def sequence_starts(position_ids: torch.Tensor) -> list[int] | None:
    """Where each sequence of a packed row starts (its position resets), or ``None`` for a single sequence: the
    tag ``tag_sequence_starts`` left, else read from the positions."""
    tagged = getattr(position_ids, STARTS_TAG, None)
    if tagged is not None:
        return list(tagged) if len(tagged) > 1 else None
    positions = position_ids.reshape(-1)
    resets = (positions[1:] != positions[:-1] + 1).nonzero().flatten()
    if resets.numel() == 0:
        return None
    return [0, *(resets + 1).tolist()]


def length_groups(sizes: list[int]) -> list[list[int]]:
    """Sequences (indices into ``sizes``) grouped longest first; a sequence joins the current group while the
    group's padded attention work stays within ``PADDED_WORK`` times its sequences' own."""
    groups: list[list[int]] = []
    work = 0
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        size = sizes[index]
        if groups and (len(groups[-1]) + 1) * sizes[groups[-1][0]] ** 2 <= PADDED_WORK * (work + size * size):
            groups[-1].append(index)
            work += size * size
        else:
            groups.append([index])
            work = size * size
    return groups


def packed_sdpa_forward(module, query, key, value, attention_mask, **kwargs):
    """sdpa; on a packed row (the marker mask), causal sdpa on each sequence (its queries, keys and values only)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not _is_marker(attention_mask):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    position_ids = kwargs.get("position_ids")
    if position_ids is None or query.size(0) != 1 or query.size(2) != key.size(2):
        raise RuntimeError("packed_sdpa: a packed row needs its position_ids and no cache")
    starts = sequence_starts(position_ids) or [0]
    kwargs.pop("is_causal", None)
    sizes = tuple(end - start for start, end in zip(starts, [*starts[1:], query.size(2)], strict=True))
    # [T, heads, dim]: index_select / index_copy along tokens are single gathers and scatters, forward and backward
    tokens = [x[0].transpose(0, 1) for x in (query, key, value)]
    outputs = []
    plan = _group_plan(sizes, query.device)
    for count, longest, row_index, slot_index in plan.groups:
        def padded(x, count=count, longest=longest, row_index=row_index, slot_index=slot_index):
            empty = x.new_zeros(count * longest, x.size(1), x.size(2))
            rows = x if row_index is None else x.index_select(0, row_index)
            return empty.index_copy(0, slot_index, rows).view(count, longest, x.size(1), x.size(2)).transpose(1, 2)

        # Right-padded and causal: every real query sees only its own sequence's earlier keys.
        out = sdpa_attention_forward(module, *(padded(x) for x in tokens), None, is_causal=True, **kwargs)[0]
        outputs.append(out.reshape(count * longest, out.size(2), out.size(3)).index_select(0, slot_index))
    if plan.order is None:  # one group, in row order
        return outputs[0].unsqueeze(0), None
    return torch.cat(outputs).index_select(0, plan.order).unsqueeze(0), None


class _GroupPlan:
    """The index tensors of one packed row's groups, built once for all the layers of a forward, from host integers
    (nothing read back from the device)."""

    def __init__(self, sizes: tuple[int, ...], device: torch.device) -> None:
        starts = [0]
        for size in sizes[:-1]:
            starts.append(starts[-1] + size)
        groups = length_groups(list(sizes))
        self.groups, rows = [], []
        for group in groups:
            members = sorted(group)  # in row order: one group needs no reordering at all
            longest = max(sizes[i] for i in group)
            row_index = [t for i in members for t in range(starts[i], starts[i] + sizes[i])]
            slot_index = [slot * longest + t for slot, i in enumerate(members) for t in range(sizes[i])]
            gather = None if len(groups) == 1 else torch.tensor(row_index).to(device)  # the whole row: as it is
            self.groups.append((len(group), longest, gather, torch.tensor(slot_index).to(device)))
            rows += row_index
        self.order = None if len(groups) == 1 else torch.tensor(rows).argsort().to(device)


@functools.lru_cache(maxsize=8)
def _group_plan(sizes: tuple[int, ...], device: torch.device) -> _GroupPlan:
    return _GroupPlan(sizes, device)


def _tagged_packed_sequences(find):
    """transformers' ``find_packed_sequence_indices`` (which reads from the device whether a row is packed, once
    per forward), answering from the host starts of a tagged row: the same sequence indices, or ``None`` for a
    single sequence, without the read."""
    @functools.wraps(find)
    def find_packed_sequences(position_ids: torch.Tensor):
        starts = getattr(position_ids, STARTS_TAG, None)
        if starts is None or position_ids.size(0) != 1:
            return find(position_ids)
        if len(starts) < 2:
            return None
        first = position_ids[:, :1] - 1
        return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)

    find_packed_sequences.untagged = find
    return find_packed_sequences


def register_packed_sdpa() -> str:
    """Register ``packed_sdpa`` with transformers (idempotent) and return its name; a tagged packed row's mask
    check takes its host starts (``_tagged_packed_sequences``)."""
    from transformers import AttentionInterface, masking_utils
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_forward)
    AttentionMaskInterface.register(PACKED_SDPA, _packed_row_mask)
    find = getattr(masking_utils, "find_packed_sequence_indices", None)
    if find is not None and not hasattr(find, "untagged"):
        masking_utils.find_packed_sequence_indices = _tagged_packed_sequences(find)
    return PACKED_SDPA
