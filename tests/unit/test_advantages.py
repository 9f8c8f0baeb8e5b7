"""engine/rl/advantages.py (public as engine.grpo.algorithms): every estimator and reward combination against its
formula computed independently, element by element in float64 (verl's and OpenRLHF's definitions), on one rank;
tests/test_grpo_loss_types.py checks them on 2 ranks, where the normalisation is over the global batch."""

import math

import pytest
import torch
from advantage_formulas import baseline_centred, returns, whiten

from engine.grpo.algorithms import (
    combine_rewards,
    outcome_token_rewards,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    returns_to_go,
    rloo_advantages,
)

# Three responses: one with a tool call in the middle (mask 0 at positions 2-3), one short, one without loss tokens.
MASK = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
REWARDS = torch.tensor([[0.1, -0.2, 0.0, 0.0, 0.3, 1.0], [-0.1, 0.05, 0.5, 0.0, 0.0, 0.0], [0.0] * 6])


def test_rloo_is_each_score_minus_the_mean_of_the_others():
    scores = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 3.0, 4.0])
    groups = [0, 0, 0, 1, 1, 2, "g"]
    got = rloo_advantages(scores, groups)
    members = {0: [0, 1, 2], 1: [3, 4], 2: [5], "g": [6]}
    for gid, rows in members.items():
        for i in rows:
            others = [float(scores[j]) for j in rows if j != i]
            want = float(scores[i]) - sum(others) / len(others) if others else float(scores[i])  # alone: baseline 0
            assert got[i].item() == pytest.approx(want, abs=1e-6), (gid, i)
    assert rloo_advantages(scores, torch.tensor([0, 0, 0, 1, 1, 2, 3])).tolist() == got.tolist()
    with pytest.raises(ValueError, match="group_ids has 2"):
        rloo_advantages(scores, [0, 1])


def test_returns_carry_over_tokens_outside_the_mask():
    got = returns_to_go(REWARDS, MASK, gamma=0.5)
    want = returns(REWARDS.tolist(), MASK.tolist(), 0.5)
    for (i, t), value in want.items():
        assert got[i, t].item() == pytest.approx(value, abs=1e-6)
    # the tool tokens pass the answer's return back undiscounted; padding past the end holds 0
    assert got[0, 2].item() == got[0, 3].item() == pytest.approx(0.3 + 0.5 * 1.0)
    assert got[1, 3:].tolist() == [0.0, 0.0, 0.0] and got[2].abs().sum().item() == 0.0


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_normalises_the_returns_over_the_batch(gamma):
    got = reinforce_pp_advantages(REWARDS, MASK, gamma=gamma)
    want = whiten(returns(REWARDS.tolist(), MASK.tolist(), gamma))
    for (i, t), value in want.items():
        assert got[i, t].item() == pytest.approx(value, abs=1e-5)
    assert got[MASK == 0].abs().sum().item() == 0.0  # no advantage outside the loss tokens
    assert got.shape == MASK.shape and got.dtype == torch.float32


def test_reinforce_pp_baseline_subtracts_the_group_mean_of_totals():
    rewards = torch.cat([REWARDS, torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 2.0]])])
    mask = torch.cat([MASK, torch.tensor([[1, 1, 1, 1, 1, 1]])])
    groups = [0, 0, 0, 1]  # the last is alone: its baseline is 0
    got = reinforce_pp_baseline_advantages(rewards, mask, groups)
    want = whiten(baseline_centred(rewards.tolist(), mask.tolist(), groups))
    for (i, t), value in want.items():
        assert got[i, t].item() == pytest.approx(value, abs=1e-5)
    assert got[mask == 0].abs().sum().item() == 0.0


def test_the_outcome_sits_at_the_last_loss_token():
    got = outcome_token_rewards(torch.tensor([1.0, 2.0, 3.0]), MASK)
    assert got.tolist() == [[0, 0, 0, 0, 0, 1.0], [0, 0, 2.0, 0, 0, 0], [0] * 6]


def test_normalize_then_sum_normalises_each_reward_in_its_group():
    by_function = torch.tensor([[1.0, 0.0, 1.0, 5.0, 5.0], [10.0, 30.0, 20.0, 0.0, 8.0]])
    weights, groups = (1.0, 0.5), [0, 0, 0, 1, 1]
    got = combine_rewards(by_function, weights, groups, mode="normalize_then_sum")
    want = []
    for i in range(5):
        total = 0.0
        for f, weight in enumerate(weights):
            rows = [j for j in range(5) if groups[j] == groups[i]]
            values = [float(by_function[f, j]) for j in rows]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            total += weight * (float(by_function[f, i]) - mean) / (std + 1e-6)
        want.append(total)
    assert got.tolist() == pytest.approx(want, abs=1e-5)
    assert got[3].item() == pytest.approx(0.5 * (0.0 - 4.0) / (math.sqrt(32) + 1e-6), abs=1e-6)  # 5 = 5: no spread
    summed = combine_rewards(by_function, weights, groups)
    assert summed.tolist() == pytest.approx((by_function[0] + 0.5 * by_function[1]).tolist())
    with pytest.raises(ValueError, match="unknown multi_reward"):
        combine_rewards(by_function, weights, groups, mode="mean")
