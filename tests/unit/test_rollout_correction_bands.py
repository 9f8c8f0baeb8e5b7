"""Issue 48: the two rollout corrections that hold at any length, ``band`` (IcePop: a token leaves the gradient
when its ratio is outside [1/cap, cap], either side) and ``seq_geo_mask`` (a sequence leaves it when the geometric
mean of its token ratios is outside the band), against formulas written out here in plain Python, at 4,096-token
responses where the sequence product of ``sequence_mask`` is no use, split over two ranks, and their masked
fractions."""

import math
import random

import pytest
import torch

from engine.rl.checks import correction_problems
from engine.rl.rollout_correction import MismatchStats, importance_weights, sequences_left_out

CAP = 1.5


def _case(rows: int, length: int, spread: float, seed: int):
    """Random trainer and engine log-probs and a loss mask with a few tokens left out (tool output, padding); each
    sequence's tokens share an offset too (a stale engine), so some sequences' mean leaves the band."""
    rng = random.Random(seed)
    sampling = [[-rng.uniform(0.1, 3.0) for _ in range(length)] for _ in range(rows)]
    offsets = [rng.uniform(-0.8, 0.8) for _ in range(rows)]
    trainer = [[s + offset + rng.gauss(0.0, spread) for s in row] for row, offset in zip(sampling, offsets,
                                                                                         strict=True)]
    mask = [[int(rng.random() > 0.1) for _ in range(length)] for _ in range(rows)]
    return trainer, sampling, mask


def _tensors(*rows):
    return [torch.tensor(r, dtype=torch.float32) for r in rows]


def _band_by_hand(trainer, sampling, mask, cap):
    weights, masked = [], []
    for t_row, s_row, m_row in zip(trainer, sampling, mask, strict=True):
        w_row, k_row = [], []
        for t, s, m in zip(t_row, s_row, m_row, strict=True):
            r = math.exp(t - s)
            inside = 1 / cap <= r <= cap
            w_row.append(r if (m and inside) else 0.0)
            k_row.append(bool(m and not inside))
        weights.append(w_row)
        masked.append(k_row)
    return weights, masked


def _geometric_by_hand(trainer, sampling, mask, cap):
    weights, means, masked = [], [], []
    for t_row, s_row, m_row in zip(trainer, sampling, mask, strict=True):
        logs = [t - s for t, s, m in zip(t_row, s_row, m_row, strict=True) if m]
        mean = math.fsum(logs) / max(len(logs), 1)
        out = not (1 / cap <= math.exp(mean) <= cap)
        means.append(math.exp(mean))
        weights.append([0.0 if (out or not m) else min(math.exp(t - s), cap)
                        for t, s, m in zip(t_row, s_row, m_row, strict=True)])
        masked.append([bool(m and out) for m in m_row])
    return weights, means, masked


def test_band_masks_tokens_outside_the_band_on_both_sides():
    trainer, sampling, mask = _case(6, 40, spread=0.5, seed=1)
    want_weights, want_masked = _band_by_hand(trainer, sampling, mask, CAP)
    weights, ratios, masked = importance_weights(*_tensors(trainer, sampling, mask), "band", cap=CAP)
    assert torch.allclose(weights, torch.tensor(want_weights), rtol=1e-5, atol=1e-6)
    assert masked.tolist() == want_masked
    flat = [r for row, m_row in zip(ratios.tolist(), mask, strict=True) for r, m in zip(row, m_row, strict=True) if m]
    assert any(r < 1 / CAP for r in flat) and any(r > CAP for r in flat)  # both edges were exercised
    # token_mask, the one-sided mask, keeps what band leaves out below the band
    one_sided = importance_weights(*_tensors(trainer, sampling, mask), "token_mask", cap=CAP)[2]
    assert masked.sum() > one_sided.sum()


def test_seq_geo_mask_masks_sequences_by_their_geometric_mean_ratio():
    trainer, sampling, mask = _case(8, 30, spread=0.6, seed=2)
    want_weights, want_means, want_masked = _geometric_by_hand(trainer, sampling, mask, CAP)
    weights, ratios, masked = importance_weights(*_tensors(trainer, sampling, mask), "seq_geo_mask", cap=CAP)
    assert torch.allclose(ratios, torch.tensor(want_means), rtol=1e-5)
    assert torch.allclose(weights, torch.tensor(want_weights), rtol=1e-5, atol=1e-6)
    assert masked.tolist() == want_masked
    kept = [not any(row) for row in want_masked]
    assert any(kept) and not all(kept)  # some sequences in the band, some outside


def test_at_4096_tokens_the_geometric_mean_stays_finite_where_the_product_saturates():
    """Every token off by 0.001 in log-probability (the engines agree closely): the product over 4,096 tokens is
    e^4.1 = 60, far outside any band, so ``sequence_mask`` drops the sequence; a log-ratio of 0.01 a token
    reaches e^41, clamped at e^20. The geometric mean is e^0.001 (kept) and e^0.01 (kept); a sequence whose
    tokens are off by 0.6 each (mean outside log 1.5) is masked; large per-token swings that cancel stay finite."""
    length = 4096
    sampling = [[-1.0] * length for _ in range(4)]
    offsets = [[0.001] * length, [0.01] * length, [0.6] * length, [30.0, -30.0] * (length // 2)]
    trainer = [[s + o for s, o in zip(s_row, o_row, strict=True)] for s_row, o_row in zip(sampling, offsets,
                                                                                           strict=True)]
    mask = [[1] * length for _ in range(4)]
    t = _tensors(trainer, sampling, mask)
    _, products, product_masked = importance_weights(*t, "sequence_mask", cap=CAP)
    assert product_masked[0].all() and product_masked[1].all()  # the product leaves the band at this length
    assert products[1].item() == pytest.approx(math.exp(20.0), rel=1e-4)  # clamped: the true e^41 is lost
    weights, means, masked = importance_weights(*t, "seq_geo_mask", cap=CAP)
    _, want_means, want_masked = _geometric_by_hand(trainer, sampling, mask, CAP)
    assert torch.isfinite(weights).all() and torch.isfinite(means).all()
    assert means.tolist() == pytest.approx(want_means, rel=1e-4)
    assert [bool(row.any()) for row in masked] == [any(row) for row in want_masked] == [False, False, True, False]
    assert weights[0].tolist() == pytest.approx([math.exp(0.001)] * length, rel=1e-5)


def test_a_sequence_split_over_two_ranks_gets_the_mean_of_all_its_tokens():
    """Sequence parallelism: each rank holds part of a sequence's loss tokens; the sums and the token counts are
    added over the group before the mean, so a rank with few tokens still masks by the whole sequence's mean."""
    trainer, sampling, mask = _tensors(*_case(5, 24, spread=0.6, seed=3))
    halves = (mask * (torch.arange(24) < 7), mask * (torch.arange(24) >= 7))
    partial = [torch.stack([((trainer - sampling) * part).sum(dim=-1), part.sum(dim=-1)]) for part in halves]
    whole_weights, whole_means, whole_masked = importance_weights(trainer, sampling, mask, "seq_geo_mask", cap=CAP)
    for rank, part in enumerate(halves):
        def across(value, rank=rank):  # the group's sum: this rank's own value plus the other's
            assert torch.allclose(value, partial[rank])
            return value + partial[1 - rank]

        weights, means, masked = importance_weights(trainer, sampling, part, "seq_geo_mask", cap=CAP, across=across)
        assert torch.allclose(means, whole_means, rtol=1e-5)
        assert torch.allclose(weights, whole_weights * part, rtol=1e-5, atol=1e-6)
        assert masked.tolist() == (whole_masked & part.bool()).tolist()


def test_masked_fractions_per_kind():
    trainer, sampling, mask = _tensors(*_case(8, 30, spread=0.6, seed=2))
    _, _, want_masked = _geometric_by_hand(trainer.tolist(), sampling.tolist(), mask.int().tolist(), CAP)
    stats = MismatchStats()
    for rows in (slice(0, 3), slice(3, 8)):  # two micro-batches
        _, ratios, masked = importance_weights(trainer[rows], sampling[rows], mask[rows], "seq_geo_mask", cap=CAP)
        stats.add(trainer[rows], sampling[rows], mask[rows], ratios, masked,
                  left_out=sequences_left_out("seq_geo_mask", CAP, ratios))
    metrics = stats.metrics(lambda sums: sums, lambda value: value)
    masked_tokens = sum(map(sum, want_masked))
    assert metrics["rollout/is_masked_frac"] == pytest.approx(masked_tokens / float(mask.sum()))
    assert metrics["rollout/is_masked_frac/sequence"] == pytest.approx(sum(map(any, want_masked)) / 8)
    band = MismatchStats()
    _, ratios, masked = importance_weights(trainer, sampling, mask, "band", cap=CAP)
    band.add(trainer, sampling, mask, ratios, masked)
    metrics = band.metrics(lambda sums: sums, lambda value: value)
    assert metrics["rollout/is_masked_frac"] == pytest.approx(float(masked.sum()) / float(mask.sum()))
    assert "rollout/is_masked_frac/sequence" not in metrics


def test_the_modes_are_named_in_the_check():
    class Algorithm:
        rollout_correction, rollout_correction_cap = "seq_geo", 2.0

    assert correction_problems(Algorithm) == [
        "algorithm.rollout_correction must be one of none, token_truncate, token_mask, sequence_truncate, "
        "sequence_mask, band, seq_geo_mask, got 'seq_geo' (did you mean algorithm.rollout_correction=seq_geo_mask?)"]
    Algorithm.rollout_correction = "band"
    assert correction_problems(Algorithm) == []
