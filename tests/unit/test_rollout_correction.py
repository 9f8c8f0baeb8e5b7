"""engine/rl/rollout_correction.py: the importance weights of every algorithm.rollout_correction mode against
numbers worked out by hand, over the loss mask only, and the rollout/* mismatch metrics over micro-batches and
ranks."""

import math

import pytest
import torch

from engine.rl.rollout_correction import CORRECTION_MODES, MismatchStats, importance_weights

# Two sequences; the trainer's log-probs minus the engine's give the per-token log ratios below.
# Sequence 0 has 3 loss tokens with ratios 1.5, 3.0 (above the cap 2), 0.5; sequence 1 has 1 loss token (ratio
# 1.2) then a token outside the loss mask (a tool's output, ratio e^5) and padding.
LOG_RATIO = torch.tensor([[math.log(1.5), math.log(3.0), math.log(0.5)], [math.log(1.2), 5.0, 0.0]])
SAMPLING = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -3.0, 0.0]])
TRAINER = SAMPLING + LOG_RATIO
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def close(actual, expected):
    assert torch.allclose(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected), atol=1e-5), actual


def test_token_modes():
    weights, ratios, masked = importance_weights(TRAINER, SAMPLING, MASK, "token_truncate", cap=2.0)
    close(weights, [[1.5, 2.0, 0.5], [1.2, 0.0, 0.0]])  # min(r, 2); nothing outside the loss mask
    close(ratios * MASK, [[1.5, 3.0, 0.5], [1.2, 0.0, 0.0]])
    assert not masked.any()
    weights, _, masked = importance_weights(TRAINER, SAMPLING, MASK, "token_mask", cap=2.0)
    close(weights, [[1.5, 0.0, 0.5], [1.2, 0.0, 0.0]])  # r where r <= 2, else 0
    assert masked.tolist() == [[False, True, False], [False, False, False]]  # the tool token is not counted


def test_sequence_modes_use_the_product_of_the_ratios_over_loss_tokens():
    # Sequence 0: 1.5 * 3 * 0.5 = 2.25 (above the cap); sequence 1: 1.2 (its tool token left out).
    weights, ratios, masked = importance_weights(TRAINER, SAMPLING, MASK, "sequence_truncate", cap=2.0)
    close(ratios, [2.25, 1.2])
    close(weights, [[2.0, 2.0, 2.0], [1.2, 0.0, 0.0]])
    assert not masked.any()
    weights, _, masked = importance_weights(TRAINER, SAMPLING, MASK, "sequence_mask", cap=2.0)
    close(weights, [[0.0, 0.0, 0.0], [1.2, 0.0, 0.0]])
    assert masked.sum() == 3


def test_none_measures_but_leaves_the_gradient_alone():
    weights, ratios, _ = importance_weights(TRAINER, SAMPLING, MASK, "none", cap=2.0)
    close(weights, MASK.float().tolist())
    close(ratios * MASK, [[1.5, 3.0, 0.5], [1.2, 0.0, 0.0]])
    with pytest.raises(ValueError, match="unknown rollout correction 'clip'"):
        importance_weights(TRAINER, SAMPLING, MASK, "clip", cap=2.0)
    assert CORRECTION_MODES == ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "band",
                                "seq_geo_mask")


def test_equal_log_probs_give_weight_one_in_every_mode():
    for mode in CORRECTION_MODES:
        weights, _, masked = importance_weights(SAMPLING, SAMPLING, MASK, mode, cap=2.0)
        close(weights, MASK.float().tolist())
        assert not masked.any()


def test_mismatch_metrics_over_micro_batches_and_ranks():
    stats = MismatchStats()
    for rows in ([0], [1]):  # two micro-batches
        _, ratios, masked = importance_weights(TRAINER[rows], SAMPLING[rows], MASK[rows], "token_mask", cap=2.0)
        stats.add(TRAINER[rows], SAMPLING[rows], MASK[rows], ratios, masked)
    stats.add(TRAINER[:0], SAMPLING[:0], MASK[:0], LOG_RATIO[:0], MASK[:0].bool())  # a filler: nothing counts
    other_rank = {"mismatch/tokens": 2.0, "mismatch/diff_sum": 0.2, "mismatch/ratios": 2.0, "mismatch/ratio_sum": 2.0,
                  "mismatch/masked": 0.0, "mismatch/sequences": 0.0, "mismatch/masked_sequences": 0.0}
    other_maxima = iter([0.1, 1.01, -0.99])  # the other rank's diff max, ratio max and minus its ratio min

    def summed(values):  # this rank's sums plus the other rank's
        return {key: value + other_rank[key] for key, value in values.items()}

    def largest(value):
        return max(value, next(other_maxima))

    metrics = stats.metrics(summed, largest)
    diffs = [math.log(1.5), math.log(3.0), math.log(2.0), math.log(1.2)]
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx((sum(diffs) + 0.2) / 6, rel=1e-5)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(math.log(3.0), rel=1e-5)
    assert metrics["rollout/is_ratio_mean"] == pytest.approx((1.5 + 3.0 + 0.5 + 1.2 + 2.0) / 6, rel=1e-5)
    assert metrics["rollout/is_ratio_min"] == pytest.approx(0.5, rel=1e-5)
    assert metrics["rollout/is_ratio_max"] == pytest.approx(3.0, rel=1e-5)
    assert metrics["rollout/is_masked_frac"] == pytest.approx(1 / 6)
    assert "rollout/is_masked_frac/sequence" not in metrics  # a token mode: no sequence was left out whole
    assert MismatchStats().metrics(lambda d: d, lambda v: v) == {}  # no loss token anywhere: no metrics


def test_a_sequence_split_over_two_ranks_gets_the_ratio_of_all_its_tokens():
    """Sequence parallelism: each rank holds some of a sequence's loss tokens; ``across`` adds the ranks' partial
    log-ratio sums (as the group's all-reduce does), so both get the whole sequence's ratio and weights; the
    mismatch figures count each token once and each sequence once (on the first rank only)."""
    own = (MASK * (torch.arange(3) < 1), MASK * (torch.arange(3) >= 1))

    def across(value):
        return sum((LOG_RATIO * part).sum(dim=-1) for part in own)

    whole_weights, whole_ratios, _ = importance_weights(TRAINER, SAMPLING, MASK, "sequence_truncate", cap=2.0)
    split, stats = MismatchStats(), MismatchStats()
    for rank, part in enumerate(own):
        weights, ratios, masked = importance_weights(TRAINER, SAMPLING, part, "sequence_truncate", cap=2.0,
                                                     across=across)
        close(ratios, whole_ratios.tolist())
        close(weights, (whole_weights * part).tolist())
        split.add(TRAINER, SAMPLING, part, ratios, masked, sequences=MASK.bool().any(dim=-1) & (rank == 0))
    stats.add(TRAINER, SAMPLING, MASK, whole_ratios, torch.zeros_like(MASK, dtype=torch.bool))
    assert split.sums() == pytest.approx(stats.sums())


def test_each_micro_batchs_own_statistics_add_up_to_one_accumulators_exactly():
    """Issue 47: a micro-batch records its own mismatch (``PolicyMicroBatch.mismatch``) and the update adds them up
    (``MismatchStats.total``), bit for bit what one accumulator fed every micro-batch gave; unrecorded ones count
    nothing."""
    one, parts = MismatchStats(), []
    for rows in ([0], [1], []):  # two micro-batches and a filler
        _, ratios, masked = importance_weights(TRAINER[rows], SAMPLING[rows], MASK[rows], "token_mask", cap=2.0)
        own = MismatchStats()
        for stats in (one, own):
            stats.add(TRAINER[rows], SAMPLING[rows], MASK[rows], ratios, masked)
        parts.append(own)
    total = MismatchStats.total([*parts, None])
    assert total.sums() == one.sums() and total.maxima() == one.maxima()
    assert total.sums()["mismatch/tokens"] == 4.0
    assert MismatchStats.total([None, MismatchStats()]).sums() == MismatchStats().sums()


def test_grpo_resolves_its_loss_settings_once_when_built():
    """Issue 47: ``algorithm.loss_type`` is resolved when the algorithm is built, into a frozen ``LossSettings``
    (before, on every use and again per micro-batch)."""
    import dataclasses

    from engine.rl.algorithms.grpo.algorithm import GRPOAlgorithm
    from engine.rl.algorithms.grpo.config import build_config

    config = build_config("cpu-demo", None, ["algorithm.loss_type=dr_grpo"])
    algorithm = GRPOAlgorithm(config)
    settings = algorithm.settings
    assert (settings.agg, settings.scale_rewards, settings.norm_length) == ("seq-mean-token-sum-norm", "none", 4)
    config.algorithm.loss_type = "gspo"  # the built algorithm keeps what it resolved
    assert algorithm.settings is settings and GRPOAlgorithm(config).settings.loss_mode == "gspo"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.agg = "token-mean"
