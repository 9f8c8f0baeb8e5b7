"""DPO's parts and step, run by every rank inside the frame's loop: for each global batch of pairs, this rank's
micro-batches (a pair's chosen and rejected always together, packed in one row) -> the reference's sequence
log-probs (one forward per micro-batch) -> the policy's forward/backward with the pair losses (``loss.py``) ->
optimizer step; validation over the held-out pairs.

The step's loss is the mean over the global batch's pairs of each pair's loss, plus ``dpo.rpo_alpha`` times the
mean NLL over every chosen response token of the global batch: both exact whatever the split into ranks,
micro-batches and sequence-parallel slices.
"""

from __future__ import annotations

import dataclasses
import functools

from .... import FSDPEngine
from ....sequence_parallel import slice_log_probs
from ....train.recipe import Evaluation, Plan
from ...pair_batches import PairMicroBatch, PairObjective, chosen_and_rejected, group_total, rank_share, sequence_sums
from ...run_config import engine_config
from ...step import Parts, score
from .config import DPOSettings, reference_config
from .loss import METRICS, pair_losses, pair_metrics
from .reference import Reference

NAMES = ("rewards/accuracies", *(name for name in METRICS if name != "rewards/accuracies"))
CURVES = (("loss", "loss"), ("val/loss", "validation loss"), ("rewards/accuracies", "reward accuracy"),
          ("val/rewards/accuracies", "validation reward accuracy"), ("rewards/margins", "reward margin"),
          ("logps/chosen", "log-prob of chosen"), ("grad_norm", "grad norm"), ("step_time_s", "step time (s)"))


def dpo_loss(module, micro: PairMicroBatch, device, sp, settings: DPOSettings, nll_scale: float = 0.0):
    """One micro-batch's mean pair loss (this rank's share of it with a sequence-parallel group ``sp``), weighted by
    its pairs, and TRL's metrics; ``micro.reference`` holds its sequences' reference log-probs.

    ``nll_scale``: the global batch's pairs over its chosen tokens, so that ``rpo_alpha * nll_scale * (the chosen
    tokens' NLL) / pairs`` weighted by the pairs adds up to ``rpo_alpha`` times the step's token-mean NLL."""
    layout, mask = rank_share(micro, sp, device)
    tokens, _ = slice_log_probs(module, layout)
    logps = group_total(sequence_sums(tokens * mask, layout, layout.sequences), sp)
    pairs = len(micro.pairs)
    if not pairs:  # a filler: it joins the collectives and weighs nothing
        return logps.sum() * 0.0, 0.0, {name: 0.0 for name in NAMES}
    chosen, rejected = chosen_and_rejected(logps)
    ref_chosen, ref_rejected = chosen_and_rejected(micro.reference.to(device))
    counts = chosen_and_rejected(sequence_sums(micro.mask, micro.layout, micro.layout.sequences).to(device))
    losses = pair_losses(chosen, rejected, ref_chosen, ref_rejected, beta=settings.beta,
                         loss_type=settings.loss_type, label_smoothing=settings.label_smoothing,
                         chosen_tokens=counts[0], rejected_tokens=counts[1])
    loss = losses.mean()
    if settings.rpo_alpha:
        loss = loss - settings.rpo_alpha * nll_scale * chosen.sum() / pairs
    metrics = pair_metrics(chosen, rejected, ref_chosen, ref_rejected, settings.beta)
    return loss / sp.size, float(pairs), {name: value / sp.size for name, value in metrics.items()}


class DPOObjective(PairObjective):
    """DPO's loss on pairs, against the reference's log-probs (filled in ``prepare``, before the update)."""

    metrics = NAMES

    def __init__(self, reference: Reference) -> None:
        self.reference = reference

    def loss(self, parts, items):
        return functools.partial(dpo_loss, device=parts.backend.device(), sp=parts.engine.sequence_parallel,
                                 settings=parts.plan.config.dpo, nll_scale=nll_scale(items))

    def prepare(self, parts, micro_batches) -> None:
        self.reference.fill(micro_batches, parts.backend.device())


def build_engines(config, total_steps: int, backend, model_dir: str | None = None) -> tuple[FSDPEngine, Reference]:
    """The policy (``model.path``, or ``model_dir``: a merged model to evaluate, without LoRA) and the reference
    (``dpo.ref_model``, else ``model.path``: the model DPO starts from; with LoRA, the policy's base weights)."""
    options = engine_config(config, total_steps)
    if model_dir is not None:
        options = dataclasses.replace(options, lora_rank=0)
    policy = FSDPEngine(model_dir or config.model.path, options, backend)
    frozen = None
    if options.lora_rank == 0 or config.dpo.ref_model is not None:
        frozen = FSDPEngine(config.dpo.ref_model or config.model.path, reference_config(config), backend)
    return policy, Reference(policy, frozen)


def build(plan: Plan, backend) -> Parts:
    config = plan.config
    policy, reference = build_engines(config, plan.total_steps, backend)
    packed = config.train.padding_free and policy.packed_input_supported()
    return Parts(plan, policy, backend, packed, DPOObjective(reference))


def nll_scale(pairs) -> float:
    """Pairs over chosen tokens of a global batch (``dpo_loss``'s ``nll_scale``)."""
    return len(pairs) / max(1, sum(pair.chosen.supervised for pair in pairs))


def evaluate(config, model_dir: str | None, backend) -> Evaluation:
    """The eval command's figures on this rank: the validation figures of ``model_dir`` (or ``model.path``)."""
    from ...pair_eval import evaluation_set

    pairs = evaluation_set(config)
    policy, reference = build_engines(config, 1, backend, model_dir)
    packed = config.train.padding_free and policy.packed_input_supported()
    parts = Parts(Plan(config, policy.world_size, 1, {}), policy, backend, packed, DPOObjective(reference))
    return Evaluation(score(parts, pairs))
