"""Cut a micro-batch along the token axis, one slice per rank of the group, sequence boundaries intact.

Every rank of a group holds the whole micro-batch before splitting, so targets are shifted first (the token a
position predicts may sit on the next rank) and each rank keeps the positions it holds as predictors. Rows are
padded at the end to a multiple of the group size (filler tokens whose positions continue the row: causal
attention never lets a real token see them). The model gets each rank's ``input_ids`` and ``position_ids`` and the
whole micro-batch's positions (``SplitForward``), from which attention rebuilds the sequences; no attention mask.

``split_layout`` does it for an ``engine.packing.Layout`` (packed or padded): the slice is a ``Layout`` of the
rank's own scored tokens whose ``rows``/``columns`` still index the whole micro-batch's ``[n, R]``, so the
recipes' per-token functions (log-probs, entropy, cross-entropy through the chunked output layer) run on it as
they are. ``split_inputs`` does it for a plain batch with ``labels`` (``-100``: not scored).
"""

from __future__ import annotations

import dataclasses

import torch

from ..packing.layout import FILLER_TOKEN, Layout
from .attention import SplitForward


def padded_width(width: int, size: int) -> int:
    """``width`` rounded up to a multiple of ``size``."""
    return -(-width // size) * size


def pad_row_ends(input_ids: torch.Tensor, positions: torch.Tensor, size: int):
    """Rows padded at the end to a multiple of ``size``: filler tokens, positions continuing each row."""
    extra = padded_width(input_ids.size(1), size) - input_ids.size(1)
    if extra == 0:
        return input_ids, positions
    ids = torch.nn.functional.pad(input_ids, (0, extra), value=FILLER_TOKEN)
    more = positions[:, -1:] + torch.arange(1, extra + 1, device=positions.device)
    return ids, torch.cat([positions, more], dim=1)


def _rank_columns(width: int, sp) -> slice:
    chunk = width // sp.size
    return slice(sp.rank * chunk, (sp.rank + 1) * chunk)


@dataclasses.dataclass
class LayoutSlice(Layout):
    """One rank's share of a micro-batch's ``Layout``: its inputs, and its own scored tokens.

    ``owned``: indices of those tokens in the whole layout's ``targets`` order. ``group_tokens``: the scored tokens
    of the whole micro-batch (a token-mean loss divides its slice's sum by it: the group's shares then add up to
    the micro-batch's mean). A rank that owns no scored token keeps one stand-in (so its forward and backward still
    join the group's exchanges) that ``scored_mask`` leaves out.
    """

    owned: torch.Tensor | None = None
    group_tokens: int = 0

    @property
    def scored_mask(self) -> torch.Tensor:
        if self.owned.numel() == 0:
            return torch.zeros(self.sequences, self.width, dtype=torch.long)
        return super().scored_mask


def split_layout(layout: Layout, sp) -> Layout:
    """This rank's ``LayoutSlice`` of ``layout`` (``layout`` itself when ``sp`` is not enabled)."""
    if not sp.enabled:
        return layout
    full_ids, full_positions = layout.inputs["input_ids"], layout.inputs["position_ids"]
    real = layout.inputs.get("attention_mask")
    if real is None:
        real = (torch.arange(full_ids.size(1)) < layout.real_tokens).long().unsqueeze(0)
    ids, positions = pad_row_ends(full_ids, full_positions, sp.size)
    columns = _rank_columns(ids.size(1), sp)
    # Each scored token's predictor: (row of the model input, column), from the kept positions it was read at.
    keep = layout.logits_to_keep.to(torch.long)
    flat = torch.arange(layout.targets.numel()) if layout.kept_index is None else layout.kept_index.cpu()
    rows_in, cols_in = flat // keep.numel(), keep.cpu()[flat % keep.numel()]
    owned = ((cols_in >= columns.start) & (cols_in < columns.stop)).nonzero().flatten()
    local = cols_in[owned] - columns.start
    if owned.numel():
        kept_local = torch.unique(local)
        kept_index = rows_in[owned] * kept_local.numel() + torch.searchsorted(kept_local, local)
        pick = owned
    else:  # a stand-in: the slice's first position, predicting the first target; masked out
        kept_local = kept_index = pick = torch.zeros(1, dtype=torch.long)
    inputs = {"input_ids": ids[:, columns], "position_ids": positions[:, columns],
              "sequence_parallel": SplitForward(sp, positions)}
    return LayoutSlice(inputs=inputs, logits_to_keep=kept_local, kept_index=kept_index,
                       targets=layout.targets[pick], rows=layout.rows[pick], columns=layout.columns[pick],
                       scored_lengths=layout.scored_lengths,
                       real_tokens=int(real[:, columns.start:min(columns.stop, real.size(1))].sum()),
                       packed=layout.packed, filler=layout.filler, owned=owned, group_tokens=layout.targets.numel())


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` labels as the targets each position predicts: ``labels[:, 1:]`` and ``-100`` at each row's end."""
    return torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)


def split_inputs(input_ids: torch.Tensor, labels: torch.Tensor, sp, position_ids: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None) -> tuple[dict, torch.Tensor]:
    """This rank's model inputs and shifted targets ``[B, S']`` (``-100``: not scored) for a plain batch.

    Positions come from ``position_ids``, else from ``attention_mask`` (left padding skipped, as ``generate``
    numbers them), else ``0..S-1``. Labels are shifted before the cut; padding tokens score nothing.
    """
    if position_ids is None:
        position_ids = ((attention_mask.cumsum(1) - 1).clamp(min=0) if attention_mask is not None
                        else torch.arange(input_ids.size(1), device=input_ids.device).expand_as(input_ids))
    targets = shift_labels(labels if attention_mask is None else labels.masked_fill(attention_mask == 0, -100))
    if not sp.enabled:
        inputs = {"input_ids": input_ids, "position_ids": position_ids}
        return (inputs if attention_mask is None else {**inputs, "attention_mask": attention_mask}), targets
    ids, positions = pad_row_ends(input_ids, position_ids, sp.size)
    targets = torch.nn.functional.pad(targets, (0, ids.size(1) - targets.size(1)), value=-100)
    columns = _rank_columns(ids.size(1), sp)
    inputs = {"input_ids": ids[:, columns], "position_ids": positions[:, columns],
              "sequence_parallel": SplitForward(sp, positions)}
    return inputs, targets[:, columns]
