"""The step's loss as a weighted sum of per-token terms (``docs/algorithms.md``, "Loss terms").

A term is a per-token loss (the clipped policy gradient, cross-entropy on the given tokens, KL to a frozen model, the
entropy), optional per-token weights (rollout correction's importance weights, for a term marked ``corrected``) and
a normaliser of its own (``Norm``: one of ``algorithm.loss_agg``'s modes: the token mean over the global batch, the
sequence mean, a fixed constant, ...). An algorithm lists its terms; the trainer computes the streams they read
(``Streams``: the policy's log-probs and entropy, the old and frozen models' log-probs, the advantages) once per
micro-batch and adds the terms up. Packing, token budgets and sequence parallelism reach every term alike: a term
sees this rank's loss tokens (``mask``) and counts its normaliser over the whole micro-batch (``counts``), so its
shares add up over a sequence-parallel group.

When every term has the same normaliser (every GRPO loss type) the micro-batch's loss and weight are the ones
``aggregate_loss`` and ``micro_batch_scale`` give, term after term, exactly as one combined loss was computed
before. Terms with different normalisers are each divided by their own total over the mini-batch (all its
micro-batches on all ranks), and the micro-batches then add up with equal weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from .losses import aggregate_loss, device_clipped_policy_gradient, kl_penalty, micro_batch_scale

SEQUENCE_MEANS = ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclasses.dataclass(frozen=True)
class MiniBatchSize:
    """A mini-batch over all ranks: what a normaliser divides by when terms normalise differently."""

    micro_batches: int  # non-empty micro-batches, every rank's
    tokens: float  # loss tokens
    sequences: int


@dataclasses.dataclass(frozen=True)
class Norm:
    """How a term's per-token values become one number: an ``algorithm.loss_agg`` mode (``aggregate_loss``), with
    ``length`` the constant ``seq-mean-token-sum-norm`` divides by."""

    mode: str = "token-mean"
    length: float | None = None

    def reduce(self, values: Tensor, mask: Tensor, counts: Tensor) -> Tensor:
        return aggregate_loss(values, mask, self.mode, self.length, counts)

    def weight(self, counts: Tensor, micro_batches: int) -> tuple[float, Tensor | float]:
        """``(scale, weight)`` of a micro-batch's reduced value (``micro_batch_scale``)."""
        return micro_batch_scale(counts, self.mode, micro_batches)

    def total(self, mini: MiniBatchSize) -> float:
        """The sum of ``weight`` over the mini-batch's micro-batches (all ranks)."""
        if self.mode == "token-mean":
            return max(mini.tokens, 1e-6)
        if self.mode in SEQUENCE_MEANS:
            return float(mini.sequences)
        return float(mini.micro_batches)  # micro-batch-token-mean (each weighs 1), token-sum (scaled by the count)


@dataclasses.dataclass
class Streams:
    """One micro-batch's per-token inputs to the terms, on the device (this rank's share of it with sequence
    parallelism); every per-token tensor is ``[n, R]``."""

    log_probs: Tensor  # the policy's, with gradients
    entropy: Tensor  # with gradients when a term needs them
    old_log_probs: Tensor  # the sampling policy's (detached)
    advantages: Tensor  # [n] (one per sequence) or [n, R]
    mask: Tensor  # this rank's loss tokens
    counts: Tensor  # the whole micro-batch's loss tokens: every normaliser counts these
    across: Callable | None = None  # sums a tensor over the sequence-parallel group (None without)
    frozen: dict[str, Tensor] = dataclasses.field(default_factory=dict)  # frozen models' log-probs by name
    correction: Tensor | None = None  # rollout correction's importance weights (None: no engine log-probs)


PerToken = Callable[[Streams, "Tensor | None"], "tuple[Tensor, dict[str, Tensor | float]]"]


@dataclasses.dataclass(frozen=True)
class Term:
    """One part of the step's loss: ``coef`` x its per-token values reduced by ``norm``.

    ``per_token(streams, weights)`` returns the values ``[n, R]`` and metrics of its own (detached 0-dim tensors
    on the device, or floats: the engine reads them once a step, never per micro-batch); ``weights`` are rollout
    correction's importance weights when the term is ``corrected`` and the engine returned log-probs (else None).
    ``metric``: the name its reduced value is reported under (None: not reported). ``frozen``: the frozen model
    whose log-probs it needs; a micro-batch without them leaves the term out (a step timed without its reference).
    """

    per_token: PerToken
    coef: float = 1.0
    norm: Norm = Norm()
    metric: str | None = None
    corrected: bool = False
    frozen: str | None = None
    entropy_grad: bool = False  # it needs the entropy's gradient


def policy_gradient(norm: Norm, *, loss_mode: str = "vanilla", clip_low: float = 0.2, clip_high: float = 0.2,
                    clip_c: float | None = None) -> Term:
    """The clipped policy gradient (``clipped_policy_gradient``: PPO-clip, GSPO, CISPO) of the streams'
    advantages; rollout correction's weights multiply each token's advantage. Reported as ``pg_loss``, with
    ``clip_frac`` and ``approx_kl``."""
    def per_token(streams: Streams, weights: Tensor | None):
        advantages = streams.advantages
        if weights is not None:  # weights each token's policy-gradient term
            advantages = (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages) * weights
        values, metrics = device_clipped_policy_gradient(
            streams.log_probs, streams.old_log_probs, advantages, streams.mask, loss_mode=loss_mode,
            clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, counts=streams.counts, across=streams.across)
        return values, {"clip_frac": metrics["clip_frac"], "approx_kl": metrics["approx_kl"]}

    return Term(per_token, norm=norm, metric="pg_loss", corrected=True)


def kl_to(frozen: str, coef: float, norm: Norm, *, kind: str = "k3", metric: str = "kl") -> Term:
    """KL(policy || ``frozen``) per token (``kl_penalty`` of the given ``kind``), e.g. to the reference."""
    def per_token(streams: Streams, weights: Tensor | None):
        values = kl_penalty(streams.log_probs, streams.frozen[frozen], kind)
        return (values if weights is None else values * weights), {}

    return Term(per_token, coef=coef, norm=norm, metric=metric, frozen=frozen)


def entropy_bonus(coef: float, norm: Norm) -> Term:
    """``-coef`` x the policy's entropy: a bonus for keeping it (its gradient flows)."""
    def per_token(streams: Streams, weights: Tensor | None):
        return (streams.entropy if weights is None else streams.entropy * weights), {}

    return Term(per_token, coef=-coef, norm=norm, entropy_grad=True)


def cross_entropy(coef: float, norm: Norm, *, metric: str = "ce", corrected: bool = False) -> Term:
    """``-log p`` of the given tokens (the step's response tokens: supervised learning on them)."""
    def per_token(streams: Streams, weights: Tensor | None):
        values = -streams.log_probs
        return (values if weights is None else values * weights), {}

    return Term(per_token, coef=coef, norm=norm, metric=metric, corrected=corrected)


def present(terms: list[Term], streams: Streams) -> list[Term]:
    """The terms the micro-batch has inputs for (a term on a frozen model needs that model's log-probs)."""
    return [term for term in terms if term.frozen is None or term.frozen in streams.frozen]


def micro_batch_loss(terms: list[Term], streams: Streams, micro_batches: int, mini: MiniBatchSize | None,
                     filler: bool) -> tuple[Tensor, Tensor | float, dict[str, Tensor]]:
    """``(loss, weight, metrics)`` of one micro-batch for ``FSDPEngine.forward_backward_batch``: the weighted sum
    of ``terms`` over ``streams``. ``micro_batches``: the mini-batch's non-empty micro-batches over all ranks
    (``token-sum`` multiplies by it); ``mini``: its sizes, needed when the terms normalise differently; ``filler``:
    a micro-batch that only keeps the ranks' counts equal (weight 0). The metrics stay on the device (detached
    0-dim tensors): the engine adds them up there and reads the step's sums once."""
    terms = present(terms, streams)
    if not terms:
        raise ValueError("the step's loss has no term: an algorithm gives at least one")
    values = [(term, *term.per_token(streams, streams.correction if term.corrected else None)) for term in terms]
    metrics: dict[str, float] = {}
    norms = {term.norm for term in terms}
    if len(norms) == 1:  # one normaliser: one micro-batch weight serves every term
        (norm,) = norms
        scale, weight = norm.weight(streams.counts, micro_batches)
        loss = None
        for term, per_token, extra in values:
            reduced = norm.reduce(per_token, streams.mask, streams.counts)
            loss = term.coef * reduced if loss is None else loss + term.coef * reduced
            _report(metrics, term, reduced.detach() * scale, extra)
        return loss * scale, (weight * 0.0 if filler else weight), metrics
    if mini is None:
        raise ValueError("terms with different normalisers need the mini-batch's sizes (MiniBatchSize)")
    loss = torch.zeros((), dtype=streams.log_probs.dtype, device=streams.log_probs.device)
    for term, per_token, extra in values:
        scale, weight = term.norm.weight(streams.counts, micro_batches)
        share = term.norm.reduce(per_token, streams.mask, streams.counts) * (scale * weight / term.norm.total(mini))
        loss = loss + term.coef * share
        _report(metrics, term, share.detach() * micro_batches, extra)
    return loss * micro_batches, (0.0 if filler else 1.0), metrics


def _report(metrics: dict, term: Term, value: Tensor, extra: dict) -> None:
    if term.metric is not None:
        metrics[term.metric] = value
    metrics.update(extra)
