"""SFT's parts and step, run by every rank inside the frame's loop (``engine/train/loop.py``): for each global
batch, this rank's micro-batches -> forward/backward with the exact token-weighted loss (deferred gradient sync) ->
optimizer step; and validation over the whole held-out set.

Data, masks and batching are decided before the loop (``dataset.py``, ``batches.py``).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .... import FSDPEngine
from ....runtime import supervised_perf
from ....sequence_parallel import split_layout
from ....train.recipe import Plan, StepResult
from ...run_config import engine_config
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


@dataclasses.dataclass
class SFTParts:
    """What an SFT run holds on one rank."""

    plan: Plan
    engine: FSDPEngine
    backend: object
    packed: bool

    @property
    def rank(self) -> int:
        return self.engine.rank

    @property
    def world_size(self) -> int:
        return self.engine.world_size

    def micro_batches(self, items):
        """This data-parallel group's micro-batches (the same on every rank of a sequence-parallel group, whose
        ``train.micro_batch_tokens`` counts the group's tokens: each rank holds ``1/sp`` of them)."""
        t, sp = self.plan.config.train, self.engine.sequence_parallel
        return rank_micro_batches(items, sp.data_parallel_rank, sp.data_parallel_size,
                                  micro_batch_tokens=t.micro_batch_tokens, micro_batch_size=t.micro_batch_size,
                                  packed=self.packed)

    def loss(self, module, micro):
        return token_loss(module, micro, self.backend.device(), self.engine.sequence_parallel)


def build(plan: Plan, backend) -> SFTParts:
    config = plan.config
    engine = FSDPEngine(config.model.path, engine_config(config, plan.total_steps), backend)
    return SFTParts(plan, engine, backend, config.train.padding_free and engine.packed_input_supported())


def train_step(parts: SFTParts, step: int) -> StepResult:
    data, batches = parts.plan.inputs
    started = time.perf_counter()
    items = [data.train[i] for i in batches[step].indices]
    micro_batches, figures = parts.micro_batches(items)
    with parts.engine.train_mode():
        result = parts.engine.forward_backward_batch(micro_batches, parts.loss)
        grad_norm = parts.engine.optimizer_step()
    elapsed = time.perf_counter() - started
    engine_figures = parts.engine.last_step_metrics
    row = {"epoch": batches[step].epoch, "loss": result["loss"],
           "mean_token_accuracy": result["mean_token_accuracy"], "num_tokens": result["weight"],
           "tokens_per_s": result["weight"] / elapsed, "step_time_s": elapsed, "grad_norm": grad_norm,
           "lr": engine_figures["lr"], "sequences": float(len(items)), "micro_batches": figures["micro_batches"],
           "token_imbalance": figures["token_imbalance"]}
    tail = {"total_tokens": float(sum(len(i.ids) for i in items)), "skipped_updates": float(engine_figures["skipped"]),
            "peak_memory_gib": engine_figures["peak_memory_gib"]}
    pad_tokens = figures["pad_tokens"] / parts.engine.sequence_parallel.size  # summed over ranks: once per group
    perf = supervised_perf(parts.engine, [len(i.ids) for i in items], elapsed)  # perf/mfu, perf/tflops/update
    return StepResult(metrics=lambda totals, _: {**row, "pad_tokens": totals["pad_tokens"], **tail, **perf},
                      sums={"pad_tokens": pad_tokens}, shown=_shown)


def _shown(row: dict) -> dict:
    shown = {"loss": f"{row['loss']:.3f}", "acc": f"{row['mean_token_accuracy']:.3f}"}
    if "val/loss" in row:
        shown["val_loss"] = f"{row['val/loss']:.3f}"
    return shown


def validate(parts: SFTParts, step: int, baseline: bool = False) -> dict:
    """Loss and token accuracy over the whole validation set after ``step`` when due: summed over its supervised
    tokens, over ranks."""
    data, batches = parts.plan.inputs
    every = parts.plan.config.run.val_every
    due = step + 1 == len(batches) or bool(every and (step + 1) % every == 0)
    if baseline or not data.val or not due:
        return {}
    micro_batches, _ = parts.micro_batches(data.val)
    with parts.engine.eval_mode(), torch.no_grad():
        result = parts.engine.forward_backward_batch(micro_batches, parts.loss, forward_only=True)
    return {"val/loss": result["loss"], "val/mean_token_accuracy": result["mean_token_accuracy"],
            "val/num_tokens": result["weight"]}
