"""SFT as an objective of the one supervised step (``engine/offline/step.py``): its data shape (sequences with a loss
mask, ``batches.py``) and its loss, the exact token-weighted cross-entropy over the global batch's supervised tokens
(``token_loss``). Data, masks and batching are decided before the loop (``dataset.py``, ``batches.py``).
"""

from __future__ import annotations

import torch

from .... import FSDPEngine
from ....sequence_parallel import split_layout
from ....train.recipe import Plan
from ...run_config import engine_config
from ...step import Objective, Parts
from .batches import rank_micro_batches
from .loss import per_token_losses

CURVES = (("loss", "loss (supervised tokens)"), ("val/loss", "validation loss"),
          ("mean_token_accuracy", "token accuracy"), ("val/mean_token_accuracy", "validation token accuracy"),
          ("grad_norm", "grad norm"), ("lr", "learning rate"), ("tokens_per_s", "supervised tokens / s"),
          ("step_time_s", "step time (s)"))


def token_loss(module, micro, device, sp=None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Mean cross-entropy over the micro-batch's supervised tokens, weighted by their count (the engine then
    divides by the count of the whole global batch): ``(loss, weight, {"mean_token_accuracy": ...})``; logits are
    computed in chunks (``loss.py``).

    With a sequence-parallel group ``sp`` (``engine.sequence_parallel``) this rank computes only its slice's tokens
    (``split_layout``) and divides their sum by the whole micro-batch's supervised count: the group's shares add up
    to the micro-batch's mean, each token counted once, and the weight is the whole micro-batch's."""
    layout, mask = micro.layout, micro.mask
    count = mask.sum()
    if sp is not None and sp.enabled:
        layout = split_layout(layout, sp)
        mask = mask[layout.owned] if layout.owned.numel() else torch.zeros(1)  # the stand-in token scores nothing
    layout, mask = layout.to(device), mask.to(device)
    per_token, hits = per_token_losses(module, layout)  # logits exist one chunk of positions at a time
    denominator = count.clamp(min=1.0).to(device)
    loss = (per_token * mask).sum() / denominator
    correct = (hits.float() * mask).sum() / denominator
    return loss, count.detach(), {"mean_token_accuracy": correct}


class SFTObjective(Objective):
    """Sequences, each trained on its supervised tokens; a micro-batch weighs its supervised tokens."""

    metrics, weight = ("mean_token_accuracy",), "num_tokens"

    def micro_batches(self, items, rank, world_size, *, micro_batch_tokens, micro_batch_size, packed):
        return rank_micro_batches(items, rank, world_size, micro_batch_tokens=micro_batch_tokens,
                                  micro_batch_size=micro_batch_size, packed=packed)

    def lengths(self, items):
        return [len(item.ids) for item in items]

    def counts(self, items, weight, elapsed):
        return {"num_tokens": weight, "tokens_per_s": weight / elapsed, "sequences": float(len(items)),
                "total_tokens": float(sum(len(item.ids) for item in items))}

    def loss(self, parts, items):
        device, sp = parts.backend.device(), parts.engine.sequence_parallel
        return lambda module, micro: token_loss(module, micro, device, sp)

    def shown(self, row):
        shown = {"loss": f"{row['loss']:.3f}", "acc": f"{row['mean_token_accuracy']:.3f}"}
        if "val/loss" in row:
            shown["val_loss"] = f"{row['val/loss']:.3f}"
        return shown


def parts_of(plan: Plan, backend, checkpoint: str | None = None) -> Parts:
    """An SFT run's parts on this rank (``checkpoint``: a run's, loaded into the run's model whatever world size
    wrote it, for ``eval``)."""
    config = plan.config
    engine = FSDPEngine(config.model.path, engine_config(config, plan.total_steps), backend)
    if checkpoint:
        engine.load_checkpoint(checkpoint)
    return Parts(plan, engine, backend, config.train.padding_free and engine.packed_input_supported(),
                 SFTObjective())


def build(plan: Plan, backend) -> Parts:
    return parts_of(plan, backend)
