"""engine/packing/planner.py: micro-batches within the limits, the same count on every rank, balanced, pure."""

import random

import pytest

from engine.packing import SequenceTooLong, micro_batch_load, plan_micro_batches


def _lengths(count, low, high, seed=0):
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(count)]


def _check(plan, lengths, world_size, max_tokens=None, max_sequences=None):
    """Every sequence exactly once, every rank the same number of micro-batches, each within the limits."""
    seen = sorted(i for rank in plan.ranks for micro in rank for i in micro)
    assert seen == list(range(len(lengths)))
    assert len(plan.ranks) == world_size and len({len(rank) for rank in plan.ranks}) == 1
    for rank, load in zip(plan.ranks, plan.loads, strict=True):
        assert load == sum(micro_batch_load([lengths[i] for i in micro], plan.padded) for micro in rank)
        for micro in rank:
            if max_tokens is not None:
                assert micro_batch_load([lengths[i] for i in micro], plan.padded) <= max_tokens
            if max_sequences is not None:
                assert len(micro) <= max_sequences


@pytest.mark.parametrize("world_size", [1, 2, 8])
def test_a_token_budget_is_kept_and_ranks_are_balanced(world_size):
    lengths = _lengths(128, 10, 140)  # a GRPO step's prompt + response lengths, spread like the long case
    plan = plan_micro_batches(lengths, world_size, max_tokens=1024)
    _check(plan, lengths, world_size, max_tokens=1024)
    assert plan.micro_batches == -(-sum(lengths) // (world_size * 1024))  # the lower bound, no more
    assert plan.imbalance < 1.02, plan.loads


def test_the_plan_is_a_pure_function_of_the_lengths():
    lengths = _lengths(64, 1, 50, seed=3)
    first = plan_micro_batches(lengths, 4, max_tokens=200)
    assert first == plan_micro_batches(list(lengths), 4, max_tokens=200)
    ties = plan_micro_batches([7] * 10, 2, max_tokens=21)  # equal lengths: ties broken by index, not by chance
    assert ties.ranks == plan_micro_batches([7] * 10, 2, max_tokens=21).ranks


def test_a_sequence_that_fills_the_budget_runs_alone_and_one_over_it_is_refused():
    lengths = [10, 3, 4, 2, 10]
    plan = plan_micro_batches(lengths, 2, max_tokens=10)
    _check(plan, lengths, 2, max_tokens=10)
    micro_batches = [micro for rank in plan.ranks for micro in rank]
    assert (0,) in micro_batches and (4,) in micro_batches
    with pytest.raises(SequenceTooLong, match="a sequence of 11 tokens does not fit the micro-batch token budget of 1"):
        plan_micro_batches([3, 11], 2, max_tokens=10)


def test_a_count_limit_alone_and_both_limits():
    lengths = _lengths(64, 5, 60, seed=1)
    by_count = plan_micro_batches(lengths, 2, max_sequences=16)
    _check(by_count, lengths, 2, max_sequences=16)
    assert by_count.micro_batches == 2
    both = plan_micro_batches(lengths, 2, max_tokens=400, max_sequences=4)
    _check(both, lengths, 2, max_tokens=400, max_sequences=4)
    assert both.micro_batches == 8  # 64 sequences, 4 per micro-batch, 2 ranks
    with pytest.raises(ValueError, match="give max_tokens"):
        plan_micro_batches(lengths, 2)


def test_padded_micro_batches_count_rows_times_the_longest():
    lengths = _lengths(96, 5, 130, seed=2)
    plan = plan_micro_batches(lengths, 2, max_tokens=1024, padded=True)
    _check(plan, lengths, 2, max_tokens=1024)
    packed = plan_micro_batches(lengths, 2, max_tokens=1024)
    assert plan.padded and sum(plan.loads) > sum(packed.loads) == sum(lengths)
    # Longest first into the least-loaded micro-batch keeps similar lengths together: little padding.
    assert sum(plan.loads) < 1.25 * sum(lengths), (sum(plan.loads), sum(lengths))


def test_fewer_sequences_than_micro_batches_leave_empty_ones_that_every_rank_still_runs():
    plan = plan_micro_batches([5], 2, max_sequences=4)  # one sequence, two ranks
    assert plan.micro_batches == 1 and plan.non_empty == 1
    assert sorted(plan.ranks) == [((),), (((0,)),)]
    three = plan_micro_batches([3, 3, 3], 2, max_tokens=4)  # each alone; 2 ranks x 2 micro-batches
    _check(three, [3, 3, 3], 2, max_tokens=4)
    assert three.micro_batches == 2 and three.non_empty == 3
