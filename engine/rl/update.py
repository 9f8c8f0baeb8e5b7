"""The update of an RL step: the policy's log-probs of each micro-batch, the streams the algorithm's loss terms read
(``terms.py``), the rollout correction against the engine's own log-probs, and the optimizer updates over the
step's mini-batches (PPO epochs), all through ``FSDPEngine.forward_backward_batch`` and ``optimizer_step``.

What a micro-batch's loss needs comes in the micro-batch itself (``StepData.micro_batches``, a
``PolicyMicroBatch``): its rows of the advantages and of the old, frozen and engine log-probs, the mini-batch's
sizes, and its own rollout/trainer mismatch statistics (the first epoch's micro-batches only), added up after the
update.
"""

from __future__ import annotations

import dataclasses

from .groups import MicroBatchShare
from .logprobs import sequence_log_probs
from .losses import aggregate_loss
from .micro_batch import PolicyMicroBatch
from .rollout_correction import MismatchStats, importance_weights, sequences_left_out
from .terms import Streams, Term, micro_batch_loss


@dataclasses.dataclass(frozen=True)
class Correction:
    """``algorithm.rollout_correction`` and ``_cap`` (``rollout_correction.py``)."""

    mode: str
    cap: float

    @classmethod
    def of(cls, algorithm) -> Correction:
        return cls(algorithm.rollout_correction, algorithm.rollout_correction_cap)


def policy_loss_of(module, micro: PolicyMicroBatch, terms: list[Term], rollout, correction: Correction, sp, device):
    """``(loss, weight, metrics)`` of one micro-batch (``forward_backward_batch``'s ``step_fn``): the policy's
    log-probs and entropy under the sampling distribution (``rollout``'s temperature, top-k, top-p), then the
    terms' weighted sum; the entropy's token mean is reported as ``entropy``."""
    # This rank's slice with sequence parallelism (else the whole micro-batch): its own loss tokens ``mask``,
    # the whole micro-batch's ``counts`` for every normaliser, so the group's results add up (``groups.py``).
    share = MicroBatchShare.of(micro, sp, device)
    layout, mask, counts = share.layout, share.mask, share.counts
    entropy_grad = any(term.entropy_grad for term in terms)  # else the entropy is a metric only
    log_probs, entropy = sequence_log_probs(module, layout, rollout.temperature, with_entropy=True,
                                            entropy_grad=entropy_grad, top_k=rollout.top_k, top_p=rollout.top_p)
    old = log_probs.detach() if micro.old_log_probs is None else micro.old_log_probs.to(device)
    weights = None
    if micro.sampling_log_probs is not None:  # the engine's own: measure the mismatch, correct for it
        sampled = micro.sampling_log_probs.to(device)
        weights, ratios, masked = importance_weights(old, sampled, mask, correction.mode, correction.cap,
                                                     share.across)
        if micro.mismatch is not None:  # the first PPO epoch of an update
            micro.mismatch.add(old, sampled, mask, ratios, masked, share.counted_sequences(),
                               sequences_left_out(correction.mode, correction.cap, ratios))
    streams = Streams(log_probs, entropy, old, micro.advantages.to(device), mask, counts, share.across,
                      {name: values.to(device) for name, values in micro.frozen.items()}, weights)
    loss, weight, metrics = micro_batch_loss(terms, streams, micro.micro_batches, micro.mini_batch, layout.filler)
    metrics["entropy"] = aggregate_loss(entropy.detach(), mask, "token-mean", counts=counts)  # read once a step
    return loss, weight, metrics


def idle_update() -> dict:
    """The policy's figures of a step that does not update it (``Algorithm.updates_policy``: a warm-up)."""
    figures = dict.fromkeys(("loss", "pg_loss", "clip_frac", "approx_kl", "entropy", "grad_norm", "lr", "updates",
                             "skipped_updates", "peak_memory_gib"), 0.0)
    return {**figures, "mismatch": MismatchStats()}


def ppo_updates(actor, data, loss_fn, epochs: int) -> dict:
    """``epochs`` passes over the step's mini-batches, one optimizer update each; the metrics averaged over the
    updates (``skipped_updates`` counted, ``peak_memory_gib`` the largest), with ``mismatch``: the rollout
    engine's log-probs against the policy's over the first epoch (``MismatchStats``)."""
    totals: dict[str, float] = {}
    updates, peak_gib = 0, 0.0
    recorded = []  # the first epoch's micro-batches' own mismatch statistics
    with actor.train_mode():
        for epoch in range(epochs):
            for mini in data.mini_batches:  # the rollout's log-probs are compared once a step
                micro_batches = data.micro_batches(mini, record_mismatch=epoch == 0)
                metrics = actor.forward_backward_batch(micro_batches, loss_fn)
                recorded += [micro.mismatch for micro in micro_batches]
                metrics.pop("peak_memory_gib")  # covered by the step's figure below
                metrics["grad_norm"] = actor.optimizer_step()
                # The step's peak covers the whole update (onload, forward/backward, the step); each update
                # measures its own, so keep the largest, do not average.
                peak_gib = max(peak_gib, actor.last_step_metrics["peak_memory_gib"])
                metrics["lr"] = actor.last_step_metrics["lr"]
                metrics["skipped_updates"] = float(actor.last_step_metrics["skipped"])
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
                updates += 1
    averaged = {key: value / updates for key, value in totals.items()}
    averaged["skipped_updates"] = totals["skipped_updates"]  # a count, not a mean
    averaged["updates"] = float(updates)
    averaged["peak_memory_gib"] = peak_gib
    return {**averaged, "mismatch": MismatchStats.total(recorded)}
