"""``engine.grpo.algorithms.gae_advantages`` against GAE computed independently, one sequence at a time in plain
Python: the actions of a sequence are the positions its mask keeps (tool tokens in the middle and padding at the
end are not actions), the TD error of an action bootstraps from the next action's value (0 after the last), and
the advantages are whitened over the mask of all rows with the unbiased std."""

import math
import random

import pytest
import torch

from engine.grpo.algorithms import gae_advantages


def reference(rewards, values, mask, gamma, lam):
    raw = [[0.0] * len(row) for row in rewards]
    for b, row in enumerate(mask):
        actions = [t for t, keep in enumerate(row) if keep]
        following, next_value = 0.0, 0.0
        for t in reversed(actions):
            delta = rewards[b][t] + gamma * next_value - values[b][t]
            following = delta + gamma * lam * following
            raw[b][t] = following
            next_value = values[b][t]
        for t in range(len(row)):  # off the mask: the next action's advantage (0 after the last)
            if not row[t]:
                later = [raw[b][u] for u in actions if u > t]
                raw[b][t] = later[0] if later else 0.0
    kept = [raw[b][t] for b, row in enumerate(mask) for t, keep in enumerate(row) if keep]
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((x - mean) ** 2 for x in kept) / (len(kept) - 1))
    whitened = [[(x - mean) / math.sqrt(std ** 2 + 1e-8) for x in row] for row in raw]
    returns = [[raw[b][t] + values[b][t] for t in range(len(row))] for b, row in enumerate(raw)]
    return whitened, returns


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (1.0, 0.95), (0.99, 0.9), (0.9, 0.0)])
def test_gae_matches_an_independent_computation(gamma, lam):
    rng = random.Random(int(gamma * 100 + lam * 10))
    mask = [[1, 1, 1, 1, 1, 1, 1, 1],
            [1, 1, 0, 0, 1, 1, 0, 0],  # two tool tokens inside a multi-turn response, then padding
            [1, 1, 1, 0, 0, 0, 0, 0],
            [0, 1, 1, 1, 0, 1, 1, 0]]
    rewards = [[rng.uniform(-0.1, 0.1) for _ in row] for row in mask]  # a per-token KL penalty, say
    for row, keep in zip(rewards, mask, strict=True):
        row[max(t for t, k in enumerate(keep) if k)] += rng.choice([0.0, 1.0])  # the outcome on the last action
    values = [[rng.uniform(-1, 1) for _ in row] for row in mask]
    advantages, returns = gae_advantages(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask),
                                         gamma=gamma, lam=lam)
    want_advantages, want_returns = reference(rewards, values, mask, gamma, lam)
    assert advantages.shape == returns.shape == (4, 8)
    torch.testing.assert_close(returns, torch.tensor(want_returns), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(advantages, torch.tensor(want_advantages), rtol=1e-5, atol=1e-5)
    kept = advantages[torch.tensor(mask, dtype=torch.bool)]
    assert abs(kept.mean().item()) < 1e-5 and kept.std().item() == pytest.approx(1.0, abs=1e-4)


def test_one_reward_at_the_end_with_gamma_and_lambda_one_is_reward_minus_value():
    """gamma = lam = 1: the advantage of every action is the final reward minus its value (Monte Carlo)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.25, 0.75], [1.0, 1.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    _, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns[mask.bool()], torch.tensor([1.0, 1.0, 1.0, 2.0, 2.0]))
