"""engine/rl/formulas.py: every loss type's value and gradient against numbers worked out from the published
formulas (GRPO, DAPO, Dr. GRPO, TRL's bnpo, GSPO, CISPO), the new advantage scalings, the overlong penalty, and the
micro-batch weights that make a split mini-batch equal one pass over it."""

import math

import pytest
import torch

from engine.grpo.algorithms import (
    AGGREGATION_MODES,
    aggregate_loss,
    grpo_advantages,
    micro_batch_scale,
    overlong_penalty,
    policy_loss,
)
from engine.rl.algorithms.grpo.loss_types import LOSS_TYPES


def close(actual, expected, tol=1e-5):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert torch.allclose(actual, expected, atol=tol, rtol=tol), (actual, expected)


# Three sequences of lengths 3, 2, 1 (padding after). Ratios r = exp(log_prob - old_log_prob):
#   sequence 0, A = +1:  1.5 (above 1 + 0.2: clipped), 1.1 (inside), 0.7 (below 0.8, but A > 0: unclipped branch)
#   sequence 1, A = -2:  0.5 (below 0.8, A < 0: clipped), 1.25 (above 1.2, A < 0: unclipped branch), pad (3.0)
#   sequence 2, A = 0.5: 1.0, pad (0.1), pad (5.0)
RATIOS = torch.tensor([[1.5, 1.1, 0.7], [0.5, 1.25, 3.0], [1.0, 0.1, 5.0]], dtype=torch.float64)
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.3, -0.9], [-0.7, -1.2, -3.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
ADV = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)

# Per-token PPO-clip loss max(-A r, -A clip(r, 0.8, 1.2)) and its gradient -A r (0 where the clipped term wins):
#   seq 0: max(-1.5, -1.2) = -1.2 (grad 0); -1.1 (grad -1.1); max(-0.7, -0.8) = -0.7 (grad -0.7)
#   seq 1: max(1.0, 1.6) = 1.6 (grad 0); max(2.5, 2.4) = 2.5 (grad 2.5)
#   seq 2: -0.5 (grad -0.5)
# Token sums 6 tokens: -1.2 - 1.1 - 0.7 + 1.6 + 2.5 - 0.5 = 0.6.
REFERENCE = {
    # GRPO: token means per sequence (-1.0, 2.05, -0.5), then their mean: 0.55 / 3; grad -A r / (3 L_i)
    "grpo": (0.55 / 3, [[0.0, -1.1 / 9, -0.7 / 9], [0.0, 2.5 / 6, 0.0], [-0.5 / 3, 0.0, 0.0]]),
    # DAPO (clip_high 0.28): token 0 becomes max(-1.5, -1.28) = -1.28: (0.6 - 0.08) / 6; grad -A r / 6
    "dapo": (0.52 / 6, [[0.0, -1.1 / 6, -0.7 / 6], [0.0, 2.5 / 6, 0.0], [-0.5 / 6, 0.0, 0.0]]),
    # Dr. GRPO, norm_length 4: token sums (-3.0, 4.1, -0.5) / 4, mean over 3: 0.6 / 12; grad -A r / 12
    "dr_grpo": (0.05, [[0.0, -1.1 / 12, -0.7 / 12], [0.0, 2.5 / 12, 0.0], [-0.5 / 12, 0.0, 0.0]]),
    # bnpo, one micro-batch: the token mean 0.6 / 6; grad -A r / 6
    "bnpo": (0.1, [[0.0, -1.1 / 6, -0.7 / 6], [0.0, 2.5 / 6, 0.0], [-0.5 / 6, 0.0, 0.0]]),
    # GSPO, clip [1 - 3e-4, 1 + 4e-4]: sequence ratios s = (1.5 x 1.1 x 0.7)^(1/3) = 1.0492057,
    # (0.5 x 1.25)^(1/2) = 0.7905694, 1.0. Seq 0: max(-1.0492, -1.0004) = -1.0004 (clipped); seq 1:
    # max(1.5811, 2 x 0.9997) = 1.9994 (clipped); seq 2: -0.5 (grad -A s / (3 L) = -0.5 / 3).
    "gspo": ((-1.0004 + 1.9994 - 0.5) / 3, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-0.5 / 3, 0.0, 0.0]]),
    # CISPO, weights clip(r, 0, 5) = r, detached: -r A log_prob, log_prob = old + log r; token mean.
    #   seq 0: -1.5 (-1 + 0.4054651) = 0.8918023, -1.1 (-2 + 0.0953102) = 2.0951588, -0.7 (-0.5 - 0.3566749) =
    #          0.5996724; seq 1: 0.5 x 2 x (-1.5 - 0.6931472) = -2.1931472, 1.25 x 2 x (-0.3 + 0.2231436) =
    #          -0.1921411; seq 2: -1 x 0.5 x -0.7 = 0.35. Sum 1.5513452 / 6. Gradient -w A / 6.
    "cispo": (1.5513452 / 6, [[-1.5 / 6, -1.1 / 6, -0.7 / 6], [1.0 / 6, 2.5 / 6, 0.0], [-0.5 / 6, 0.0, 0.0]]),
}


def _loss(loss_mode, agg, clip_low, clip_high, norm_length=None, ratios=RATIOS, old=OLD, adv=ADV, mask=MASK):
    log_prob = (old + ratios.log()).requires_grad_()
    loss, metrics = policy_loss(log_prob, old, adv, mask, loss_mode=loss_mode, clip_low=clip_low,
                                clip_high=clip_high, agg=agg, norm_length=norm_length)
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_every_loss_type_against_its_published_formula(loss_type):
    recipe = LOSS_TYPES[loss_type]
    loss, grad, _ = _loss(recipe.loss_mode, recipe.agg, recipe.clip_low, recipe.clip_high, norm_length=4)
    want_loss, want_grad = REFERENCE[loss_type]
    close(loss, want_loss)
    close(grad, want_grad)


def test_gspo_gradient_is_the_papers_inside_the_clip_range():
    # Wider clip (0.2): seq 0's s = 1.0492057 is inside, seq 1's 0.7905694 < 0.8 with A < 0 is clipped.
    # Paper: grad of -(1/B) sum_i A_i s_i w.r.t. each token of sequence i is -(1/B) A_i s_i / L_i.
    loss, grad, metrics = _loss("gspo", "seq-mean-token-mean", 0.2, 0.2)
    s0 = (1.5 * 1.1 * 0.7) ** (1 / 3)
    close(loss, (-s0 + 1.6 - 0.5) / 3)
    close(grad, [[-s0 / 9] * 3, [0.0, 0.0, 0.0], [-0.5 / 3, 0.0, 0.0]])
    # clip_frac: seq 1's two tokens of the 6: 1/3; ratio_mean over tokens: (3 s0 + 2 x 0.7905694 + 1) / 6
    close(metrics["clip_frac"], 1 / 3)
    close(metrics["ratio_mean"], (3 * s0 + 2 * math.sqrt(0.625) + 1) / 6)
    # With token-mean the same per-sequence ratio gives -A s / N on each token (N = 6 tokens).
    _, grad, _ = _loss("gspo", "token-mean", 0.2, 0.2)
    close(grad, [[-s0 / 6] * 3, [0.0, 0.0, 0.0], [-0.5 / 6, 0.0, 0.0]])


def test_gspo_equals_trls_sequence_level_form_on_random_tensors():
    """TRL (importance_sampling_level="sequence"): coef = exp(mean log-ratio) with its gradient, broadcast."""
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    log_prob = (old + 0.3 * torch.randn(5, 7, generator=gen, dtype=torch.float64)).requires_grad_()
    mask = (torch.rand(5, 7, generator=gen) < 0.7).long()
    mask[:, 0] = 1
    adv = torch.randn(5, generator=gen, dtype=torch.float64)
    for agg in ("seq-mean-token-mean", "token-mean"):
        ours, _ = policy_loss(log_prob, old, adv, mask, loss_mode="gspo", clip_low=0.1, clip_high=0.1, agg=agg)
        (grad_ours,) = torch.autograd.grad(ours, log_prob)
        m = mask.double()
        coef = torch.exp(((log_prob - old) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True))
        per_token = -torch.min(coef * adv[:, None], coef.clamp(0.9, 1.1) * adv[:, None]).expand(-1, 7)
        theirs = aggregate_loss(per_token, mask, agg)
        (grad_theirs,) = torch.autograd.grad(theirs, log_prob)
        close(ours.detach(), theirs.detach(), tol=1e-9)
        close(grad_ours, grad_theirs, tol=1e-9)


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # verl's convention, clip [0.8, 1.2]: weights 1.2, 1.1, 0.8 | 0.8, 1.2 | 1.0: every token has a gradient -w A / 6
    loss, grad, metrics = _loss("cispo", "token-mean", 0.2, 0.2)
    close(grad, [[-1.2 / 6, -1.1 / 6, -0.8 / 6], [1.6 / 6, 2.4 / 6, 0.0], [-0.5 / 6, 0.0, 0.0]])
    close(metrics["clip_frac"], 4 / 6)  # 1.5, 0.7, 0.5, 1.25 lie outside [0.8, 1.2]
    # value: -w A log_prob = 1.2 x 0.5945349 + 2.0951588 + 0.8 x 0.8566749 - 0.8 x 2 x 2.1931472
    #        + 1.2 x 2 x (-0.0768564) + 0.35
    want = 1.2 * 0.5945349 + 2.0951588 + 0.8 * 0.8566749 - 1.6 * 2.1931472 - 2.4 * 0.0768564 + 0.35
    close(loss, want / 6)


@pytest.mark.parametrize("mode", ["gspo", "cispo"])
def test_dual_clip_is_for_the_vanilla_loss_only(mode):
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), loss_mode=mode,
                    clip_c=3.0)


def test_unknown_loss_mode_and_missing_norm_length():
    with pytest.raises(ValueError, match="vanilla"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), loss_mode="ppo")
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(torch.ones(2, 2), torch.ones(2, 2), "seq-mean-token-sum-norm")


# ---------------------------------------------------------------- advantages

SCORES = torch.tensor([1.0, 0.0, 2.0, 4.0, 3.0])
IDS = [0, 1, 0, 1, 0]  # group 0: 1, 2, 3 (mean 2); group 1: 0, 4 (mean 2); centred: -1, -2, 0, 2, 1


def test_batch_scale_centres_per_group_and_divides_by_the_batch_std():
    # batch std of 1, 0, 2, 4, 3 (unbiased): mean 2, squares 1 + 4 + 0 + 4 + 1 = 10, / 4 -> sqrt(2.5) = 1.5811388
    close(grpo_advantages(SCORES, IDS, scale="batch"), [c / (1.5811388 + 1e-6) for c in (-1, -2, 0, 2, 1)])
    # one rank's share, with the std of the whole batch passed in
    close(grpo_advantages(SCORES, IDS, scale="batch", batch_std=2.0), [c / 2.000001 for c in (-1, -2, 0, 2, 1)])


def test_scale_names_and_the_older_keyword():
    close(grpo_advantages(SCORES, IDS, scale="none"), [-1.0, -2.0, 0.0, 2.0, 1.0])
    assert torch.equal(grpo_advantages(SCORES, IDS, scale="group"), grpo_advantages(SCORES, IDS, norm_by_std=True))
    assert torch.equal(grpo_advantages(SCORES, IDS, scale="none"), grpo_advantages(SCORES, IDS, norm_by_std=False))
    with pytest.raises(ValueError, match="group"):
        grpo_advantages(SCORES, IDS, scale="global")
    with pytest.raises(ValueError, match="contradicts"):
        grpo_advantages(SCORES, IDS, scale="batch", norm_by_std=False)


def test_overlong_penalty_is_linear_over_the_buffer():
    # max 10 tokens, buffer 4: free up to 6, then -(L - 6) / 4: lengths 3, 6, 7, 9, 10 -> 0, 0, -0.25, -0.75, -1
    lengths = torch.tensor([3, 6, 7, 9, 10])
    close(overlong_penalty(lengths, 10, 4), [0.0, 0.0, -0.25, -0.75, -1.0])
    close(overlong_penalty(lengths, 10, 4, factor=0.5), [0.0, 0.0, -0.125, -0.375, -0.5])
    close(overlong_penalty(lengths, 10, 0), [0.0] * 5)
    with pytest.raises(ValueError, match="smaller than max_new_tokens"):
        overlong_penalty(lengths, 10, 10)


# ---------------------------------------------------------------- micro-batch weights

def _engine_pass(values, mask, mode, parts, norm_length=4):
    """What FSDPEngine.forward_backward_batch computes: sum_m weight_m x (scale_m x loss_m) / sum_m weight_m."""
    total, weights = 0.0, 0.0
    for rows in parts:
        scale, weight = micro_batch_scale(mask[rows], mode, len(parts))
        total = total + float(weight) * scale * aggregate_loss(values[rows], mask[rows], mode, norm_length)
        weights += float(weight)
    return total / weights


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_uneven_micro_batches_equal_one_pass_over_the_mini_batch(mode):
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(6, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 0, 0],
                         [1, 1, 1, 1, 0]])
    parts = [slice(0, 1), slice(1, 4), slice(4, 6)]  # 5, 3 and 7 tokens; 1, 3 and 2 sequences
    got = _engine_pass(values, mask, mode, parts)
    if mode == "micro-batch-token-mean":  # by definition: the mean of each micro-batch's token mean (bnpo)
        want = sum(aggregate_loss(values[rows], mask[rows], "token-mean") for rows in parts) / len(parts)
    else:
        want = aggregate_loss(values, mask, mode, norm_length=4)
    (grad_got,) = torch.autograd.grad(got, values)
    (grad_want,) = torch.autograd.grad(want, values)
    close(got.detach(), want.detach(), tol=1e-10)
    close(grad_got, grad_want, tol=1e-10)


def test_a_micro_batch_without_loss_tokens_weighs_almost_nothing():
    # Every response masked (mask_truncated): a zero update instead of the engine's "weights sum to 0" error.
    scale, weight = micro_batch_scale(torch.zeros(2, 3), "token-mean")
    assert scale == 1.0 and 0 < float(weight) <= 1e-6
    with pytest.raises(ValueError, match="micro_batches"):
        micro_batch_scale(torch.ones(2, 3), "token-sum")
