"""accel-dpo's losses on a real tiny model, in process: when the policy is the reference the first loss is exactly
ln 2 (sigmoid), 1 / (4 beta^2) (ipo) and 1 (hinge); the losses, rewards, log-probs and gradients of every loss type
(with label smoothing and the RPO NLL term) equal formulas computed independently here (each sequence alone, fp64
log-softmax over the full vocabulary); packed micro-batches give what padded ones give."""

import math

import pytest
import torch
from sft_reference import relative_error

from engine.demo_model import build_tokenizer
from engine.offline.objectives.dpo.config import DPOSettings
from engine.offline.objectives.dpo.loss import pair_losses
from engine.offline.objectives.dpo.reference import sequence_log_probs
from engine.offline.objectives.dpo.trainer import dpo_loss, nll_scale
from engine.offline.pair_batches import rank_pair_micro_batches
from engine.offline.pair_data import demo_pairs
from engine.offline.pairs import tokenize_pair
from engine.sequence_parallel import SequenceParallel
from engine.tiny_model import tiny_qwen2

CPU, ONE = torch.device("cpu"), SequenceParallel.single(0, 1)
CASES = {"sigmoid": DPOSettings(beta=0.1), "sigmoid, smoothed, rpo": DPOSettings(beta=0.3, label_smoothing=0.2,
                                                                                   rpo_alpha=0.5),
         "ipo": DPOSettings(beta=0.2, loss_type="ipo"), "hinge": DPOSettings(beta=2.0, loss_type="hinge")}


@pytest.fixture(scope="module")
def setup():
    tokenizer = build_tokenizer(512)
    pairs = [tokenize_pair(p, tokenizer) for p in demo_pairs(6, seed=3)]
    torch.manual_seed(0)
    policy, reference = (tiny_qwen2(seed=seed, vocab_size=len(tokenizer), hidden_size=32, layers=2)
                         for seed in (1, 2))
    return pairs, policy.float(), reference.float()


def _micro_batch(pairs, packed):
    micro, _ = rank_pair_micro_batches(pairs, 0, 1, micro_batch_tokens=None, micro_batch_size=len(pairs),
                                       packed=packed)
    assert len(micro) == 1 and len(micro[0].pairs) == len(pairs)
    return micro[0]


def _independent_logps(model, item) -> torch.Tensor:
    """The response's log-prob: one sequence alone, every position's fp64 log-softmax, its scored tokens summed."""
    ids = torch.tensor([item.ids])
    logits = model(input_ids=ids).logits[0, :-1].double()
    picked = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return (picked * torch.tensor(item.mask[1:], dtype=torch.float64)).sum()


def _independent_loss(settings, policy, reference, pairs):
    beta, eps = settings.beta, settings.label_smoothing
    losses, figures = [], {"chosen": [], "rejected": []}
    chosen_nll = torch.zeros((), dtype=torch.float64)
    for pair in pairs:
        pc, pr = _independent_logps(policy, pair.chosen), _independent_logps(policy, pair.rejected)
        with torch.no_grad():
            rc, rr = _independent_logps(reference, pair.chosen), _independent_logps(reference, pair.rejected)
        h = (pc - rc) - (pr - rr)
        if settings.loss_type == "sigmoid":  # -log sigmoid(x) = log(1 + exp(-x))
            losses.append((1 - eps) * torch.log1p(torch.exp(-beta * h)) + eps * torch.log1p(torch.exp(beta * h)))
        elif settings.loss_type == "hinge":
            losses.append(torch.clamp(1 - beta * h, min=0))
        else:
            nc, nr = sum(pair.chosen.mask[1:]), sum(pair.rejected.mask[1:])
            losses.append(((pc - rc) / nc - (pr - rr) / nr - 1 / (2 * beta)) ** 2)
        chosen_nll = chosen_nll - pc
        figures["chosen"].append(float(beta * (pc - rc).detach()))
        figures["rejected"].append(float(beta * (pr - rr).detach()))
    loss = torch.stack(losses).mean()
    if settings.rpo_alpha:
        loss = loss + settings.rpo_alpha * chosen_nll / sum(sum(p.chosen.mask[1:]) for p in pairs)
    return loss, figures


def _grads(model):
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


@pytest.mark.parametrize("name", CASES)
def test_the_first_loss_when_the_policy_is_the_reference(setup, name):
    pairs, policy, _ = setup
    settings = CASES[name]
    micro = _micro_batch(pairs, packed=True)
    micro.reference = sequence_log_probs(policy, micro, ONE, CPU)
    with torch.no_grad():
        loss, weight, metrics = dpo_loss(policy, micro, CPU, ONE, settings)
    assert weight == len(pairs)
    assert metrics["rewards/chosen"] == metrics["rewards/rejected"] == metrics["rewards/margins"] == 0.0
    assert metrics["rewards/accuracies"] == 0.0  # a tie is not a win
    if settings.rpo_alpha:
        return  # the NLL term adds to ln 2 (its value: the next test)
    want = {"sigmoid": math.log(2), "ipo": 1 / (4 * settings.beta ** 2), "hinge": 1.0}[settings.loss_type]
    assert loss.item() == pytest.approx(want, rel=1e-7, abs=0)


@pytest.mark.parametrize("name", CASES)
def test_losses_rewards_and_gradients_match_an_independent_computation(setup, name):
    pairs, policy, reference = setup
    settings = CASES[name]
    want, figures = _independent_loss(settings, policy, reference, pairs)
    want.backward()
    want_grads = _grads(policy)
    for packed in (True, False):
        micro = _micro_batch(pairs, packed)
        with torch.no_grad():
            micro.reference = sequence_log_probs(reference, micro, ONE, CPU)
        loss, _, metrics = dpo_loss(policy, micro, CPU, ONE, settings, nll_scale(pairs))
        loss.backward()
        grads = _grads(policy)
        assert loss.item() == pytest.approx(want.item(), rel=1e-5), packed
        chosen, rejected = figures["chosen"], figures["rejected"]
        assert metrics["rewards/chosen"].item() == pytest.approx(sum(chosen) / len(chosen), rel=1e-4, abs=1e-6)
        assert metrics["rewards/margins"].item() == pytest.approx(
            sum(a - b for a, b in zip(chosen, rejected, strict=True)) / len(chosen), rel=1e-4, abs=1e-6)
        wins = sum(a > b for a, b in zip(chosen, rejected, strict=True))
        assert metrics["rewards/accuracies"].item() == pytest.approx(wins / len(chosen))
        assert relative_error(grads, want_grads) < 1e-5, packed


def test_the_formulas_on_known_values():
    one = torch.tensor([1.0])
    zero = torch.zeros(1)
    # h = (1 - 0) - (0 - 0) = 1
    assert pair_losses(one, zero, zero, zero, beta=2.0).item() == pytest.approx(math.log1p(math.exp(-2.0)))
    smoothed = pair_losses(one, zero, zero, zero, beta=2.0, label_smoothing=0.25).item()
    assert smoothed == pytest.approx(0.75 * math.log1p(math.exp(-2.0)) + 0.25 * math.log1p(math.exp(2.0)))
    assert pair_losses(one, zero, zero, zero, beta=0.25, loss_type="hinge").item() == pytest.approx(0.75)
    ipo = pair_losses(one * 4, zero, zero, zero, beta=0.5, loss_type="ipo", chosen_tokens=torch.tensor([2.0]),
                      rejected_tokens=torch.tensor([3.0])).item()
    assert ipo == pytest.approx((4 / 2 - 1.0) ** 2)
    with pytest.raises(ValueError, match="unknown DPO loss type 'kto'"):
        pair_losses(one, zero, zero, zero, beta=0.1, loss_type="kto")
