"""The reward model: a causal LM directory with a sequence-classification head (``num_labels=1``) on it, as
``AutoModelForSequenceClassification`` builds it (its head new, seeded by ``train.seed``: the same on any number of
processes), and its scores read at each sequence's last token, packed or padded.

A sequence is scored where ``AutoModelForSequenceClassification`` reads it, its last token. For packed rows (and
sequence-parallel slices) each sequence carries one extra token after its end (``scoring_item``): the layout's
"scored" token is that one, so the position predicting it, the one whose hidden state the head reads, is the
sequence's last real token, wherever the sequence sits in the row or on which rank. Causal attention never lets a
real token see it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ....output_layer import replaced_forward
from ....packing import FILLER_TOKEN
from ...masks import Tokenized
from ...pairs import TokenizedPair


def factory(path: str, seed: int, pad_token_id: int | None, *, weights: bool = True):
    """A zero-argument builder of the reward model from ``path`` (a causal LM: a new head; a reward model: its own).
    Built on the meta device (the ranks that receive their shards from rank 0, an export) or with
    ``weights=False`` it is the structure alone."""
    def build():
        from transformers import AutoConfig, AutoModelForSequenceClassification
        from transformers.utils import logging

        verbosity = logging.get_verbosity()
        logging.set_verbosity_error()  # "score.weight newly initialized" is the point, not a warning
        try:
            if not weights or torch.get_default_device().type == "meta":
                config = AutoConfig.from_pretrained(path, num_labels=1, pad_token_id=pad_token_id)
                return AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
            torch.manual_seed(seed)
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
        finally:
            logging.set_verbosity(verbosity)
        model.config.pad_token_id = pad_token_id  # batched scoring finds each row's last token by it
        return model

    return build


def scoring_item(item: Tokenized) -> Tokenized:
    """``item`` with one token after its end, the only one "scored": its predictor is the item's last token."""
    return Tokenized([*item.ids, FILLER_TOKEN], [0] * len(item.ids) + [1], item.where)


def scoring_pair(pair: TokenizedPair) -> TokenizedPair:
    return TokenizedPair(scoring_item(pair.chosen), scoring_item(pair.rejected), pair.margin)


def head_of(module):
    head = getattr(module, "score", None)
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"{type(module).__name__} has no linear score head: the reward model must be a Hugging Face "
                        "sequence-classification model")
    return head


def token_rewards(module, layout) -> torch.Tensor:
    """The head's score ``[T]`` (fp32) at the position before each of ``layout``'s targets (a ``Layout`` or a
    sequence-parallel ``LayoutSlice``), from one forward; the values come back through the model's own output (its
    pooled logits), so a sharded model's backward hooks see them."""
    head = head_of(module)

    def forward(hidden):
        picked = layout.select(hidden[:, layout.logits_to_keep.to(hidden.device)])
        values = F.linear(picked, head.weight, head.bias).squeeze(-1).float()
        # Every position holds every value: whichever position the model pools per row, row 0 is them all.
        return values.view(1, 1, -1).expand(hidden.size(0), hidden.size(1), -1)

    with replaced_forward(head, forward):
        pooled = module(**layout.inputs, use_cache=False).logits
    return pooled[0]
