"""Model inputs for a micro-batch of variable-length sequences: packed in one row, or padded.

A ``SequenceBatch`` holds sequences right-padded in storage; each has a ``start``: the tokens from there on are
the scored ones (a response after its prompt), each predicted by the position before it. ``build_layout()`` turns some
of them into what the model's forward takes:

* packed: the sequences end to end in ONE row, ``position_ids`` restarting at 0 for each, and no attention mask.
  transformers then keeps attention within each sequence (``sdpa``/``eager`` build a per-sequence causal mask from
  the positions; flash-attention takes the same layout as variable-length input). No pad token is computed::

      input_ids     [ p p p r r | p p r r r r | p r ]     three sequences, prompt p and response r
      position_ids  [ 0 1 2 3 4 | 0 1 2 3 4 5 | 0 1 ]
      scored         . . x x x .  . x x x x x . x .      logits only where x: the position before each r

* padded: one row per sequence, right-padded to the longest, with an attention mask (the path for attention
  implementations that cannot take packed input). Right padding keeps every real token before any pad, so even
  an attention that ignores the mask but is causal computes the real tokens right.

Either way the model computes hidden states for every position but logits only where ``logits_to_keep`` (1-D
positions) says: the scored positions of the packed row, or the columns of the padded rows from the earliest
scored one on; ``kept_index`` then picks the scored ones out of the kept positions (rows x kept, flattened), in
``targets`` order: sequence by sequence, position by position. ``Layout.to_rows`` hands such per-token values
back per sequence as ``[n, R]`` (``R``: the longest scored part), the shape the loss functions take, with the
mask ``scored_mask``.
"""

from __future__ import annotations

import dataclasses

import torch

from .attention import tag_sequence_starts

FILLER_TOKEN = 0


@dataclasses.dataclass
class SequenceBatch:
    """Sequences right-padded in storage: row ``i`` is ``tokens[i, :lengths[i]]``, scored from ``starts[i]`` on."""

    tokens: torch.Tensor  # [N, W] int64
    lengths: torch.Tensor  # [N] int64, >= 1
    starts: torch.Tensor  # [N] int64, in [1, lengths[i] - 1]: the first scored token (at least one is scored)

    def __len__(self) -> int:
        return self.tokens.size(0)

    @property
    def scored_lengths(self) -> torch.Tensor:
        return self.lengths - self.starts

    @classmethod
    def from_parts(cls, prompts: list[torch.Tensor], responses: list[torch.Tensor]) -> SequenceBatch:
        """Prompt + response token lists (1-D tensors) as one batch; a response is the scored part."""
        lengths = torch.tensor([len(p) + len(r) for p, r in zip(prompts, responses, strict=True)], dtype=torch.long)
        tokens = torch.full((len(prompts), int(lengths.max()) if len(prompts) else 0), FILLER_TOKEN, dtype=torch.long)
        for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            tokens[row, :len(prompt) + len(response)] = torch.cat([prompt, response])
        return cls(tokens, lengths, torch.tensor([len(p) for p in prompts], dtype=torch.long))


@dataclasses.dataclass
class Layout:
    """One micro-batch's model inputs and where its scored tokens are (see the module docstring)."""

    inputs: dict[str, torch.Tensor]  # input_ids, position_ids (and attention_mask when padded)
    logits_to_keep: torch.Tensor  # 1-D positions whose logits are computed (in every row)
    kept_index: torch.Tensor | None  # [T]: the scored ones among the kept positions (rows x kept); None: all
    targets: torch.Tensor  # [T]: the scored tokens, sequence by sequence
    rows: torch.Tensor  # [T]: each scored token's sequence in the micro-batch
    columns: torch.Tensor  # [T]: its place within that sequence's scored part
    scored_lengths: list[int]  # per sequence
    real_tokens: int
    packed: bool
    filler: bool  # no sequence: a two-token stand-in that lets the rank join the collectives, weighing nothing
    row_starts: tuple[int, ...] | None = None  # packed: where each sequence starts in the row (host integers)

    @property
    def sequences(self) -> int:
        return len(self.scored_lengths)

    @property
    def width(self) -> int:
        """R: the longest scored part (the column count of ``to_rows``)."""
        return max(self.scored_lengths, default=0)

    @property
    def pad_tokens(self) -> int:
        """Tokens the forward computes that belong to no sequence (0 packed, except a filler's)."""
        return self.inputs["input_ids"].numel() - self.real_tokens

    @property
    def scored_mask(self) -> torch.Tensor:
        """``[n, R]`` long: 1 where a sequence has a scored token (a filler's one token is 0)."""
        mask = torch.zeros(self.sequences, self.width, dtype=torch.long)
        if not self.filler:
            mask[self.rows, self.columns] = 1
        return mask

    def select(self, kept: torch.Tensor) -> torch.Tensor:
        """The scored positions of ``kept`` ``[rows, kept, ...]`` (values at the kept positions) as ``[T, ...]``."""
        flat = kept.reshape(-1, *kept.shape[2:])
        return flat if self.kept_index is None else flat[self.kept_index.to(flat.device)]

    def to_rows(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token ``values`` ``[T]`` (in ``targets`` order) as ``[n, R]``, zeros where a sequence has none.

        Differentiable: gradients flow back to ``values``.
        """
        rows, columns = self.rows.to(values.device), self.columns.to(values.device)
        return values.new_zeros(self.sequences, self.width).index_put((rows, columns), values)

    def to(self, device: torch.device) -> Layout:
        index = None if self.kept_index is None else self.kept_index.to(device)
        inputs = {k: v.to(device) for k, v in self.inputs.items()}
        if self.row_starts is not None:  # the copy on the device carries the host's starts too
            tag_sequence_starts(inputs["position_ids"], self.row_starts)
        return dataclasses.replace(self, inputs=inputs, logits_to_keep=self.logits_to_keep.to(device),
                                   kept_index=index, targets=self.targets.to(device))


def ranges(begins: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """``cat(arange(b, b + s) for b, s in zip(begins, sizes))`` in a few tensor operations, not one per range."""
    offsets = torch.cumsum(sizes, 0) - sizes
    return torch.arange(int(sizes.sum()), device=sizes.device) + torch.repeat_interleave(begins - offsets, sizes)


def build_layout(batch: SequenceBatch, indices: list[int] | tuple[int, ...], packed: bool) -> Layout:
    """The model inputs for sequences ``indices`` of ``batch`` (see the module docstring); none: a filler."""
    indices = list(indices)
    filler = not indices
    if filler:  # one prompt token and one scored token, masked out by the caller (weight 0)
        batch = SequenceBatch(torch.full((1, 2), FILLER_TOKEN, dtype=torch.long), torch.tensor([2]),
                              torch.tensor([1]))
        indices = [0]
    lengths, starts = batch.lengths[indices], batch.starts[indices]
    scored = lengths - starts
    if int(starts.min()) < 1 or int(scored.min()) < 1:
        raise ValueError("every sequence needs a first token before its scored part and at least one scored token "
                         f"(starts {starts.tolist()}, lengths {lengths.tolist()})")
    count, width = len(indices), int(lengths.max())
    rows = torch.repeat_interleave(torch.arange(count), scored)
    columns = ranges(torch.zeros_like(scored), scored)
    tokens = batch.tokens[indices, :width]
    targets = tokens[rows, starts[rows] + columns]
    columns_all = torch.arange(width).unsqueeze(0).expand(count, -1)
    real = columns_all < lengths.unsqueeze(1)
    row_starts = None
    if packed:
        offsets = torch.cumsum(lengths, 0) - lengths
        row_starts = tuple(offsets.tolist())  # on the host, once: attention layers need not read them back
        inputs = {"input_ids": tokens[real].unsqueeze(0),
                  "position_ids": tag_sequence_starts(columns_all[real].unsqueeze(0), row_starts)}
        keep = offsets[rows] + starts[rows] - 1 + columns
        kept_index = None
    else:
        first = int(starts.min()) - 1
        ids = tokens.masked_fill(~real, FILLER_TOKEN)
        keep = torch.arange(first, width - 1)
        kept_index = rows * len(keep) + starts[rows] - 1 - first + columns
        inputs = {"input_ids": ids, "attention_mask": real.long(), "position_ids": columns_all.clone()}
    return Layout(inputs=inputs, logits_to_keep=keep, kept_index=kept_index, targets=targets, rows=rows,
                  columns=columns, scored_lengths=scored.tolist(), real_tokens=0 if filler else int(lengths.sum()),
                  packed=packed, filler=filler, row_starts=row_starts)
