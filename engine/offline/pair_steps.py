"""The step and validation of a trainer over preference pairs (DPO, reward models), around the recipe's own pair
loss: this rank's micro-batches of the step's pairs -> forward/backward, each micro-batch weighted by its pairs
(so the step's loss and gradients are the mean over every pair of the global batch, however it is split) ->
optimizer step -> the metrics row; validation over the whole held-out set when due."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from ..runtime import supervised_perf
from ..train.recipe import Plan, StepResult
from .pair_batches import PairMicroBatch, rank_pair_micro_batches

LossFn = Callable[[object, PairMicroBatch], tuple]  # (module, micro-batch) -> (loss share, pairs, metrics)


@dataclasses.dataclass
class PairParts:
    """What a pair trainer's run holds on one rank; ``engine`` is the one the loop checkpoints."""

    plan: Plan
    engine: object  # FSDPEngine
    backend: object
    packed: bool

    @property
    def rank(self) -> int:
        return self.engine.rank

    @property
    def world_size(self) -> int:
        return self.engine.world_size

    def micro_batches(self, pairs):
        """This data-parallel group's micro-batches of ``pairs`` (the same on every rank of a sequence-parallel
        group) and the plan's figures."""
        t, sp = self.plan.config.train, self.engine.sequence_parallel
        return rank_pair_micro_batches(pairs, sp.data_parallel_rank, sp.data_parallel_size,
                                       micro_batch_tokens=t.micro_batch_tokens, micro_batch_size=t.micro_batch_size,
                                       packed=self.packed)


def train_step(parts: PairParts, step: int, loss_fn: LossFn, metric_names: tuple[str, ...],
               prepare: Callable[[list], None] | None = None, lm_head: bool = True) -> StepResult:
    """One optimizer step over global batch ``step``; ``prepare(micro_batches)`` runs first (reference log-probs).
    ``metric_names``: the loss function's metrics for the row, the first of them the accuracy the progress bar
    shows; ``lm_head``: whether the model ends in the vocabulary's projection (not a reward model), for MFU."""
    data, batches = parts.plan.inputs
    started = time.perf_counter()
    pairs = [data.train[i] for i in batches[step].indices]
    micro_batches, figures = parts.micro_batches(pairs)
    if prepare is not None:
        prepare(micro_batches)
    with parts.engine.train_mode():
        result = parts.engine.forward_backward_batch(micro_batches, loss_fn)
        grad_norm = parts.engine.optimizer_step()
    elapsed = time.perf_counter() - started
    engine_figures = parts.engine.last_step_metrics
    tokens = float(sum(pair.tokens for pair in pairs))
    row = {"epoch": batches[step].epoch, "loss": result["loss"], **{k: result[k] for k in metric_names},
           "grad_norm": grad_norm, "lr": engine_figures["lr"], "pairs": float(len(pairs)), "num_tokens": tokens,
           "tokens_per_s": tokens / elapsed, "step_time_s": elapsed, "micro_batches": figures["micro_batches"],
           "token_imbalance": figures["token_imbalance"]}
    tail = {"skipped_updates": float(engine_figures["skipped"]), "peak_memory_gib": engine_figures["peak_memory_gib"]}
    pad_tokens = figures["pad_tokens"] / parts.engine.sequence_parallel.size  # summed over ranks: once per group
    lengths = [len(side.ids) for pair in pairs for side in (pair.chosen, pair.rejected)]
    perf = supervised_perf(parts.engine, lengths, elapsed, lm_head=lm_head)  # perf/mfu, perf/tflops/update
    return StepResult(metrics=lambda totals, _: {**row, "pad_tokens": totals["pad_tokens"], **tail, **perf},
                      sums={"pad_tokens": pad_tokens}, shown=lambda r: _shown(r, metric_names[0]))


def _shown(row: dict, accuracy: str) -> dict:
    shown = {"loss": f"{row['loss']:.3f}", "acc": f"{row[accuracy]:.3f}"}
    if f"val/{accuracy}" in row:
        shown["val_acc"] = f"{row[f'val/{accuracy}']:.3f}"
    return shown


def score(engine, micro_batches, loss_fn: LossFn, metric_names: tuple[str, ...]) -> dict:
    """Forward-only loss and metrics over every pair of ``micro_batches`` (all ranks), with ``val/`` names."""
    with engine.eval_mode(), torch.no_grad():
        result = engine.forward_backward_batch(micro_batches, loss_fn, forward_only=True)
    return {"val/loss": result["loss"], **{f"val/{k}": result[k] for k in metric_names}, "val/pairs": result["weight"]}


def validation_due(parts: PairParts, step: int, baseline: bool) -> bool:
    """After the last step and every ``run.val_every`` steps, when there is a held-out set."""
    data, batches = parts.plan.inputs
    every = parts.plan.config.run.val_every
    due = step + 1 == len(batches) or bool(every and (step + 1) % every == 0)
    return bool(data.val) and due and not baseline
