"""The advantage estimators' formulas by hand, element by element in float64 (verl's and OpenRLHF's definitions),
for tests/unit/test_advantages.py (one rank) and tests/test_grpo_loss_types.py (2 ranks: the global batch)."""

import math


def whiten(values: dict) -> dict:
    """(v - mean) / sqrt(unbiased variance + 1e-8) over the loss tokens ``values`` holds (``{(row, t): v}``)."""
    n = len(values)
    mean = sum(values.values()) / n
    variance = sum((v - mean) ** 2 for v in values.values()) / (n - 1)
    return {key: (v - mean) / math.sqrt(variance + 1e-8) for key, v in values.items()}


def loss_tokens(mask, row: int) -> list[int]:
    return [t for t in range(len(mask[row])) if mask[row][t]]


def returns(rewards, mask, gamma: float) -> dict:
    """``G_t`` at each loss token: the sum over later loss tokens ``k`` of gamma^(loss tokens between) r_k."""
    out = {}
    for i in range(len(mask)):
        tokens = loss_tokens(mask, i)
        for j, t in enumerate(tokens):
            out[i, t] = sum(gamma ** (k - j) * float(rewards[i][tokens[k]]) for k in range(j, len(tokens)))
    return out


def baseline_centred(rewards, mask, groups) -> dict:
    """Each loss token's sequence total minus its group's mean total (a group of one: its total)."""
    totals = [sum(float(rewards[i][t]) for t in loss_tokens(mask, i)) for i in range(len(mask))]
    centred = []
    for i, total in enumerate(totals):
        members = [j for j in range(len(totals)) if groups[j] == groups[i]]
        centred.append(total - sum(totals[j] for j in members) / len(members) if len(members) > 1 else total)
    return {(i, t): centred[i] for i in range(len(mask)) for t in loss_tokens(mask, i)}


def token_rewards(outcomes, mask, kl_coef: float = 0.0, old=None, ref=None) -> list[list[float]]:
    """Each response's outcome at its last loss token, less ``kl_coef`` x (old - ref) at every loss token."""
    out = []
    for i, outcome in enumerate(outcomes):
        tokens = loss_tokens(mask, i)
        row = [0.0] * len(mask[i])
        for t in tokens:
            row[t] -= kl_coef * (float(old[i][t]) - float(ref[i][t])) if kl_coef else 0.0
        if tokens:
            row[tokens[-1]] += float(outcome)
        out.append(row)
    return out


def group_normalised(values, size: int) -> list[float]:
    """(v - group mean) / (unbiased group std + 1e-6), over consecutive groups of ``size``."""
    out = []
    for start in range(0, len(values), size):
        group = [float(v) for v in values[start:start + size]]
        mean = sum(group) / size
        std = math.sqrt(sum((v - mean) ** 2 for v in group) / (size - 1))
        out += [(v - mean) / (std + 1e-6) for v in group]
    return out
