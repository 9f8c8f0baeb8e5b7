"""The one supervised step (SFT, DPO, reward models), run by every rank inside the frame's loop: the global batch's
items -> this rank's micro-batches (the objective's data shape) -> the objective's ``prepare`` (DPO's reference
log-probs) -> forward/backward with the objective's loss, each micro-batch weighted by what its loss averages over
(so the step's loss and gradients are exact however the batch is split) -> optimizer step -> the metrics row; and
scoring a held-out set (validation, ``eval``) forward only. What differs between objectives is ``Objective``'s."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from ..runtime import supervised_perf
from ..train.recipe import Plan, StepResult

LossFn = Callable[[object, object], tuple]  # (module, micro-batch) -> (loss share, weight, metrics)


class Objective:
    """What a supervised objective gives the step: its data shape (``micro_batches``, ``lengths``, ``counts``) and
    its loss (``loss``, ``metrics``); ``prepare`` runs on a step's micro-batches before the update."""

    metrics: tuple[str, ...] = ()  # the loss's figures for the row, the first the accuracy the progress bar shows
    weight: str = "num_tokens"  # what the loss's weights count (validation reports their sum as val/<weight>)
    lm_head: bool = True  # the model ends in the vocabulary's projection (MFU's count)

    def micro_batches(self, items: list, rank: int, world_size: int, *, micro_batch_tokens: int | None,
                      micro_batch_size: int, packed: bool) -> tuple[list, dict]:
        """This data-parallel rank's micro-batches of ``items`` and the plan's figures (micro_batches,
        token_imbalance, pad_tokens)."""
        raise NotImplementedError

    def lengths(self, items: list) -> list[int]:
        """Every sequence's tokens (the step's FLOPs)."""
        raise NotImplementedError

    def counts(self, items: list, weight: float, elapsed: float) -> dict:
        """The row's counts of a step over ``items`` (``weight``: the loss's weights summed over ranks)."""
        raise NotImplementedError

    def loss(self, parts: Parts, items: list) -> LossFn:
        """The loss over micro-batches of ``items`` (it may read the whole set: DPO's NLL scale)."""
        raise NotImplementedError

    def prepare(self, parts: Parts, micro_batches: list) -> None:
        """Before the loss runs over ``micro_batches`` (train and score alike)."""

    def shown(self, row: dict) -> dict:
        accuracy = self.metrics[0]
        shown = {"loss": f"{row['loss']:.3f}", "acc": f"{row[accuracy]:.3f}"}
        if f"val/{accuracy}" in row:
            shown["val_acc"] = f"{row[f'val/{accuracy}']:.3f}"
        return shown


@dataclasses.dataclass
class Parts:
    """What a supervised run holds on one rank; ``engine`` is the one the loop checkpoints."""

    plan: Plan
    engine: object  # FSDPEngine
    backend: object
    packed: bool
    objective: Objective

    @property
    def rank(self) -> int:
        return self.engine.rank

    @property
    def world_size(self) -> int:
        return self.engine.world_size

    def micro_batches(self, items: list) -> tuple[list, dict]:
        """This data-parallel group's micro-batches (the same on every rank of a sequence-parallel group, whose
        ``train.micro_batch_tokens`` counts the group's tokens: each rank holds ``1/sp`` of them)."""
        t, sp = self.plan.config.train, self.engine.sequence_parallel
        return self.objective.micro_batches(items, sp.data_parallel_rank, sp.data_parallel_size,
                                            micro_batch_tokens=t.micro_batch_tokens,
                                            micro_batch_size=t.micro_batch_size, packed=self.packed)


def train_step(parts: Parts, step: int) -> StepResult:
    """One optimizer step over global batch ``step``."""
    data, batches = parts.plan.inputs
    objective = parts.objective
    started = time.perf_counter()
    items = [data.train[i] for i in batches[step].indices]
    micro_batches, figures = parts.micro_batches(items)
    objective.prepare(parts, micro_batches)
    with parts.engine.train_mode():
        result = parts.engine.forward_backward_batch(micro_batches, objective.loss(parts, items))
        grad_norm = parts.engine.optimizer_step()
    elapsed = time.perf_counter() - started
    engine_figures = parts.engine.last_step_metrics
    row = {"epoch": batches[step].epoch, "loss": result["loss"], **{k: result[k] for k in objective.metrics},
           "grad_norm": grad_norm, "lr": engine_figures["lr"], **objective.counts(items, result["weight"], elapsed),
           "step_time_s": elapsed, "micro_batches": figures["micro_batches"],
           "token_imbalance": figures["token_imbalance"]}
    tail = {"skipped_updates": float(engine_figures["skipped"]), "peak_memory_gib": engine_figures["peak_memory_gib"]}
    pad_tokens = figures["pad_tokens"] / parts.engine.sequence_parallel.size  # summed over ranks: once per group
    perf = supervised_perf(parts.engine, objective.lengths(items), elapsed, lm_head=objective.lm_head)
    return StepResult(metrics=lambda totals, _: {**row, "pad_tokens": totals["pad_tokens"], **tail, **perf},
                      sums={"pad_tokens": pad_tokens}, shown=objective.shown)


def score(parts: Parts, items: list) -> dict:
    """Forward-only loss and metrics over every item of ``items`` (all ranks), with ``val/`` names."""
    objective = parts.objective
    micro_batches, _ = parts.micro_batches(items)
    objective.prepare(parts, micro_batches)
    with parts.engine.eval_mode(), torch.no_grad():
        result = parts.engine.forward_backward_batch(micro_batches, objective.loss(parts, items), forward_only=True)
    return {"val/loss": result["loss"], **{f"val/{k}": result[k] for k in objective.metrics},
            f"val/{objective.weight}": result["weight"]}


def validate(parts: Parts, step: int, baseline: bool = False) -> dict:
    """The held-out set's figures after ``step`` (the frame's loop calls it when validation is due); none before
    the first step."""
    data, _ = parts.plan.inputs
    if baseline or not data.val:
        return {}
    return score(parts, data.val)
