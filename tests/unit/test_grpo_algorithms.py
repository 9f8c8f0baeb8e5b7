"""GRPO algorithm functions checked against numbers worked out by hand."""

import math

import pytest
import torch

from engine.grpo.algorithms import (
    AGGREGATION_MODES,
    KL_KINDS,
    aggregate_loss,
    grpo_advantages,
    kl_penalty,
    masked_mean,
    policy_loss,
)


def close(actual, expected, tol=1e-5):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert torch.allclose(actual, expected, atol=tol, rtol=tol), (actual, expected)


# ---------------------------------------------------------------- advantages

def test_advantages_two_groups_normalised():
    # group 0: scores 1, 2, 3 -> mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> -1, 0, 1 (/ 1.000001)
    # group 1: scores 0, 4    -> mean 2, unbiased std sqrt((4 + 4) / 1) = 2.8284271 -> -/+ 2 / 2.8284271
    scores = torch.tensor([1.0, 0.0, 2.0, 4.0, 3.0])
    ids = torch.tensor([0, 1, 0, 1, 0])
    adv = grpo_advantages(scores, ids)
    close(adv, [-0.999999, -0.70710653, 0.0, 0.70710653, 0.999999])
    assert adv.dtype == torch.float32


def test_advantages_dr_grpo_is_mean_centred_only():
    # group 0 mean 2: 1-2, 2-2, 3-2; group 1 mean 2: 0-2, 4-2
    scores = torch.tensor([1.0, 0.0, 2.0, 4.0, 3.0])
    adv = grpo_advantages(scores, [0, 1, 0, 1, 0], norm_by_std=False)
    close(adv, [-1.0, -2.0, 0.0, 2.0, 1.0])


def test_advantages_group_of_one_uses_mean_zero_std_one():
    # "a" alone: (5 - 0) / (1 + 1e-6) = 4.999995; "b": scores 1, 3 -> mean 2, std sqrt(2) -> -/+ 0.7071065
    scores = torch.tensor([5.0, 1.0, 3.0])
    close(grpo_advantages(scores, ["a", "b", "b"]), [4.999995, -0.70710628, 0.70710628])
    # not normalised: "a" keeps its raw score 5; "b": 1 - 2, 3 - 2
    close(grpo_advantages(scores, ["a", "b", "b"], norm_by_std=False), [5.0, -1.0, 1.0])


def test_advantages_string_ids_and_float64_input():
    # "p1": 1, 3 -> mean 2, std sqrt(2) = 1.4142136 -> -/+ 0.7071068
    # "p2": 2, 8 -> mean 5, std sqrt(18) = 4.2426407 -> -/+ 3 / 4.2426407 = -/+ 0.7071068
    scores = torch.tensor([1.0, 2.0, 3.0, 8.0], dtype=torch.float64)
    adv = grpo_advantages(scores, ["p1", "p2", "p1", "p2"], eps=0.0)
    close(adv, [-0.7071068, -0.7071068, 0.7071068, 0.7071068])
    assert adv.dtype == torch.float32 and adv.device == scores.device


def test_advantages_eps_changes_the_denominator():
    # scores 0, 2 -> mean 1, std sqrt(2) = 1.4142136; eps 0.5 -> 1 / 1.9142136 = 0.5224077
    close(grpo_advantages(torch.tensor([0.0, 2.0]), [7, 7], eps=0.5), [-0.5224077, 0.5224077])


def test_advantages_errors():
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(torch.tensor([1.0, 2.0, 3.0]), [0, 0])
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.ones(2, 2), [0, 0])


# ---------------------------------------------------------------- aggregation

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # third sequence is all padding

# masked sums per sequence: 1+2+3 = 6, 4, 0; token counts 3, 1, 0; total 10 over 4 tokens
EXPECTED = {
    "token-mean": 2.5,  # 10 / 4
    "token-sum": 10.0,  # 6 + 4 + 0
    "seq-mean-token-sum": 10.0 / 3,  # (6 + 4 + 0) / 3 = 3.3333333
    "seq-mean-token-mean": 2.0,  # (6/3 + 4/1 + 0/max(0, 1)) / 3 = (2 + 4 + 0) / 3
    "seq-mean-token-sum-norm": 2.5 / 3,  # norm_length 4: (6/4 + 4/4 + 0/4) / 3 = 0.8333333
    "micro-batch-token-mean": 2.5,  # within one micro-batch: the token mean
}


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("mask", [MASK, MASK.bool(), MASK.float()], ids=["int", "bool", "float"])
def test_aggregate_modes(mode, mask):
    close(aggregate_loss(VALUES, mask, mode, norm_length=4), EXPECTED[mode])


# Two ranks of a sequence-parallel group own the tokens left and right of column 1: each passes its own tokens as
# the mask and the whole mask as counts; their results add up to the whole micro-batch's, in every mode.
OWN = (MASK * (torch.arange(3) < 1), MASK * (torch.arange(3) >= 1))


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_aggregate_shares_of_a_split_add_up_to_the_whole(mode):
    shares = [aggregate_loss(VALUES, own, mode, norm_length=4, counts=MASK) for own in OWN]
    close(sum(shares), EXPECTED[mode])


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo", "cispo"])
def test_policy_loss_shares_of_a_split_add_up_to_the_whole(loss_mode):
    """GSPO's sequence ratio needs every token of a sequence: ``across`` sums the ranks' partial sums (here both
    ranks' halves, as the group's all-reduce would)."""
    g = torch.Generator().manual_seed(3)
    logp, old = -torch.rand(3, 3, generator=g), -torch.rand(3, 3, generator=g)
    adv = torch.tensor([1.0, -0.5, 2.0])
    kwargs = {"loss_mode": loss_mode, "agg": "seq-mean-token-mean", "clip_low": 0.2, "clip_high": 0.2}
    whole, whole_metrics = policy_loss(logp, old, adv, MASK, **kwargs)

    def across(value):
        return sum(((logp - old).detach() * own).sum(dim=-1) for own in OWN)

    parts = [policy_loss(logp, old, adv, own, counts=MASK, across=across, **kwargs) for own in OWN]
    close(sum(loss for loss, _ in parts), whole)
    for key in ("clip_frac", "approx_kl", "ratio_mean"):
        close(sum(metrics[key] for _, metrics in parts), whole_metrics[key])


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_aggregate_all_padding_is_zero_not_nan(mode):
    out = aggregate_loss(VALUES, torch.zeros(3, 3), mode, norm_length=4)
    assert out.item() == 0.0


def test_aggregate_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        aggregate_loss(VALUES, MASK, "mean")
    assert set(EXPECTED) == set(AGGREGATION_MODES)


def test_masked_mean():
    close(masked_mean(VALUES, MASK), 2.5)  # (1+2+3+4) / 4
    assert masked_mean(VALUES, torch.zeros(3, 3)).item() == 0.0


# ---------------------------------------------------------------- policy loss

def test_ratio_one_gives_minus_mean_advantage():
    logp = torch.full((2, 3), -1.0)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -2.0])
    # per-token loss = -A: three tokens of -1, two real tokens of +2 -> (-3 + 4) / 5 = 0.2
    loss, m = policy_loss(logp, logp.clone(), adv, mask)
    close(loss, 0.2)
    assert m == {"clip_frac": 0.0, "clip_frac_lower": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0}
    # token-sum of the same per-token losses: -3 + 4 = 1
    close(policy_loss(logp, logp.clone(), adv, mask, agg="token-sum")[0], 1.0)


def test_clipped_above_with_positive_advantage():
    # ratios 1.5 and 1.1, A = +1: token 0 min(-1.5, -1.2) pessimistic -> -1.2 (clipped);
    # token 1 is inside the band -> -1.1. Mean (-1.2 - 1.1) / 2 = -1.15; clip_frac 1/2
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 1.1]]))
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2))
    close(loss, -1.15)
    close(m["clip_frac"], 0.5)
    close(m["ratio_mean"], 1.3)  # (1.5 + 1.1) / 2
    close(m["approx_kl"], -(math.log(1.5) + math.log(1.1)) / 2)  # -(0.4054651 + 0.0953102) / 2 = -0.2503876


def test_clipped_below_with_negative_advantage():
    # ratio 0.5, A = -1: L1 = 0.5, L2 = 1 * 0.8 = 0.8 -> 0.8 (clipped)
    # ratio 0.5, A = +1: L1 = -0.5, L2 = -0.8 -> -0.5 (unclipped branch is the pessimistic one)
    # mean (0.8 - 0.5) / 2 = 0.15, clip_frac 1/2
    logp = torch.log(torch.tensor([[0.5], [0.5]]))
    loss, m = policy_loss(logp, torch.zeros(2, 1), torch.tensor([-1.0, 1.0]), torch.ones(2, 1))
    close(loss, 0.15)
    close(m["clip_frac"], 0.5)


def test_asymmetric_clip_range():
    # clip_high 0.28: ratio 1.5, A = +1 -> max(-1.5, -1.28) = -1.28
    logp = torch.log(torch.tensor([[1.5]]))
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), clip_high=0.28)
    close(loss, -1.28)


def test_dual_clip_caps_negative_advantage_loss():
    # both ratios 5. A = -1: L1 = 5, L2 = 1.2, max 5, capped at -A * clip_c = 3 -> 3 (dual clip active)
    # A = +1: L1 = -5, L2 = -1.2 -> -1.2 (ordinary clip, untouched by dual clip)
    logp = torch.full((2, 1), math.log(5.0))
    adv = torch.tensor([-1.0, 1.0])
    loss, m = policy_loss(logp, torch.zeros(2, 1), adv, torch.ones(2, 1), clip_c=3.0)
    close(loss, 0.9)  # (3 - 1.2) / 2
    close(m["clip_frac"], 0.5)  # only the A = +1 token has L2 > L1
    close(m["clip_frac_lower"], 0.5)
    # without dual clipping the A = -1 token costs 5: (5 - 1.2) / 2 = 1.9
    loss, m = policy_loss(logp, torch.zeros(2, 1), adv, torch.ones(2, 1))
    close(loss, 1.9)
    assert m["clip_frac_lower"] == 0.0


def test_dual_clip_leaves_losses_below_the_cap():
    # ratio 2, A = -1: max(2, 1.2) = 2 < 3 -> stays 2, dual clip not counted
    logp = torch.full((1, 1), math.log(2.0))
    loss, m = policy_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), clip_c=3.0)
    close(loss, 2.0)
    assert m["clip_frac_lower"] == 0.0


def test_log_ratio_clamped_to_twenty():
    # log-ratio +1000 -> 20 and -1000 -> -20. A = -1 with ratio e^20: L1 = e^20 = 485165195.4, L2 = 1.2
    # A = -1 with ratio e^-20: L1 = 2.06e-9, L2 = 0.8 -> 0.8
    logp = torch.tensor([[0.0], [0.0]], requires_grad=True)
    old = torch.tensor([[-1000.0], [1000.0]])
    loss, m = policy_loss(logp, old, torch.tensor([-1.0, -1.0]), torch.ones(2, 1), agg="token-sum")
    assert torch.isfinite(loss)
    close(loss, 485165195.4097903 + 0.8, tol=1e-6)
    close(m["approx_kl"], 0.0)  # (-20 + 20) / 2
    loss.backward()
    assert torch.isfinite(logp.grad).all()


def test_per_token_advantages():
    # ratio 1, A = [[1, 2], [3, 4]], last token padded -> -(1 + 2 + 3) / 3 = -2
    logp = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    loss, _ = policy_loss(logp, logp.clone(), adv, torch.tensor([[1, 1], [1, 0]]))
    close(loss, -2.0)


def test_padded_tokens_do_not_count():
    # token 0: ratio 1, A = 1 -> -1. Token 1 is padding with ratio e^3 (would be clipped, kl -3)
    logp = torch.tensor([[0.0, 3.0]])
    loss, m = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.tensor([[True, False]]))
    close(loss, -1.0)
    assert m == {"clip_frac": 0.0, "clip_frac_lower": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0}


def test_gradient_reaches_log_prob_and_skips_padding():
    # ratio 1, token-mean over 5 real tokens: d loss / d logp = -A * ratio / 5
    # -> -1/5 = -0.2 for A = 1; 2/5 = 0.4 for A = -2; 0 for the padded token
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, _ = policy_loss(logp, logp.detach().clone(), torch.tensor([1.0, -2.0]), mask)
    loss.backward()
    close(logp.grad, [[-0.2, -0.2, -0.2], [0.4, 0.4, 0.0]])


def test_clipped_token_has_no_gradient():
    # ratio 1.5 with A = +1 sits on the clipped branch (constant -1.2): gradient 0
    logp = torch.log(torch.tensor([[1.5]])).requires_grad_()
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    loss.backward()
    close(logp.grad, [[0.0]])


@pytest.mark.parametrize("clip_c", [1.0, 0.5])
def test_clip_c_must_exceed_one(clip_c):
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), clip_c=clip_c)


# ---------------------------------------------------------------- KL penalty

@pytest.mark.parametrize(
    "logp, ref, expected",
    [
        # diff = -1 - (-1.5) = 0.5; k3: r = -0.5, exp(-0.5) + 0.5 - 1 = 0.6065307 - 0.5 = 0.1065307
        (-1.0, -1.5, {"k1": 0.5, "abs": 0.5, "k2": 0.125, "k3": 0.10653066}),
        # diff = -0.5; k3: r = 0.5, exp(0.5) - 0.5 - 1 = 1.6487213 - 1.5 = 0.1487213
        (-1.5, -1.0, {"k1": -0.5, "abs": 0.5, "k2": 0.125, "k3": 0.14872127}),
        (-2.0, -2.0, {"k1": 0.0, "abs": 0.0, "k2": 0.0, "k3": 0.0}),
    ],
)
def test_kl_kinds_by_hand(logp, ref, expected):
    assert set(expected) == set(KL_KINDS)
    for kind, value in expected.items():
        out = kl_penalty(torch.full((2, 3), logp), torch.full((2, 3), ref), kind)
        assert out.shape == (2, 3)
        close(out, torch.full((2, 3), value))


def test_kl_default_is_k3():
    close(kl_penalty(torch.tensor([[-1.0]]), torch.tensor([[-1.5]])), [[0.10653066]])


def test_k3_clamped_at_ten():
    # r = 0 - (-30) = 30 -> 20, exp(20) - 21 is huge -> 10
    # r = -30 -> -20, exp(-20) + 20 - 1 = 19.000000002 -> 10
    out = kl_penalty(torch.tensor([[-30.0, 0.0]]), torch.tensor([[0.0, -30.0]]), "k3")
    close(out, [[10.0, 10.0]])


def test_kl_unknown_kind():
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
