"""engine/rl/algorithms/grpo/dynamic_sampling.py and scoring.py: which groups are kept, when drawing stops, how ranks
agree on the batch size, how groups of several draws are put back together, and what the metrics say."""

import torch

from engine.rl.algorithms.grpo.dynamic_sampling import fill_batch, informative_groups, shares, summary
from engine.rl.prompts import Sample
from engine.rl.rewards import Reward, metric_names
from engine.rl.scoring import (
    ScoredRollout,
    concat,
    reward_metrics,
    rollout_sums,
    sample_records,
    score_rollout,
    select_groups,
)
from engine.rollout.single_turn import RolloutBatch

PAD = 0


def fake_rollout(tag: str, rewards: list[list[float]], prompt_width: int = 2, response_width: int = 3):
    """A scored rollout of len(rewards) groups; token ids encode (draw tag, row) so rows can be traced."""
    n = len(rewards[0])
    rows = len(rewards) * n
    base = 100 * (ord(tag) - ord("a") + 1)
    prompt = torch.full((rows, prompt_width), base, dtype=torch.long)
    prompt[:, 0] = PAD  # one left pad
    response = (base + torch.arange(rows)).unsqueeze(1).repeat(1, response_width)
    response_mask = torch.ones(rows, response_width, dtype=torch.long)
    response_mask[:, -1] = 0  # one right pad
    response = response * response_mask
    batch = RolloutBatch(input_ids=torch.cat([prompt, response], dim=1),
                         attention_mask=torch.cat([(prompt != PAD).long(), response_mask], dim=1),
                         response_mask=response_mask, prompt_length=prompt_width,
                         responses=[f"{tag}{i}" for i in range(rows)], clipped=torch.zeros(rows, dtype=torch.bool))
    flat = torch.tensor([r for group in rewards for r in group])
    return ScoredRollout([Sample(prompt=f"{tag}-prompt{g}", answer="") for g in range(len(rewards))], batch, n, flat,
                         flat.unsqueeze(0), torch.zeros(rows))


def single_rank(count):
    return [count]


def test_informative_groups():
    assert informative_groups(torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.5, 0.5]])) == [1]


def test_draws_until_full_and_keeps_the_first_informative_groups():
    draws = iter([fake_rollout("a", [[1, 1], [0, 1], [0, 0]]),  # one informative group of 3
                  fake_rollout("b", [[2, 2], [1, 0], [3, 1]]),  # two more: full (3 wanted) after this draw
                  fake_rollout("c", [[0, 1], [0, 1], [0, 1]])])
    result = fill_batch(lambda: next(draws), groups_wanted=3, max_draws=5, gather_counts=single_rank, rank=0,
                        pad_token_id=PAD)
    assert (result.draws, result.groups_drawn, result.groups_kept, result.groups_filtered) == (2, 6, 3, 3)
    assert result.full
    assert [s.prompt for s in result.batch.samples] == ["a-prompt1", "b-prompt1", "b-prompt2"]
    assert result.batch.rewards.tolist() == [0, 1, 1, 0, 3, 1]
    assert result.batch.batch.responses == ["a2", "a3", "b2", "b3", "b4", "b5"]
    assert len(result.drawn) == 2  # the metrics see every drawn response


def test_shares_trim_the_surplus_from_the_ranks_that_kept_most():
    assert shares([3, 1], 4) == [3, 1] and shares([3, 1], 8) == [3, 1]  # at most what is wanted: all of it
    assert shares([5, 1], 4) == [3, 1] and shares([4, 4], 4) == [2, 2] and shares([3, 3], 5) == [3, 2]
    assert shares([0, 6, 2], 4) == [0, 2, 2]


def test_ranks_draw_until_the_step_is_full_together():
    """A simulated second rank whose first draw is all filtered: this rank draws again with it (generate is a
    collective), and the global surplus is trimmed from this rank, which kept the most."""
    calls = []
    other = iter([0, 1])  # the other rank's kept count after each draw

    def gather_counts(count):
        calls.append(count)
        return [count, next(other)]

    draws = iter([fake_rollout("a", [[0, 1], [0, 1]]), fake_rollout("b", [[0, 1], [0, 1]])])
    result = fill_batch(lambda: next(draws), groups_wanted=4, max_draws=5, gather_counts=gather_counts, rank=0,
                        pad_token_id=PAD)
    assert result.draws == 2 and calls == [2, 4] and result.full  # 2 + 0, then 4 + 1 >= 4
    assert result.groups_kept == 3 and len(result.batch.samples) == 3 and result.trains  # shares([4, 1], 4)
    metrics = summary({k: 2 * v for k, v in result.metrics().items()}, world_size=2)  # as if both ranks said so
    assert metrics["sampling/draws"] == 2.0 and metrics["sampling/batch_full"] == 1.0
    assert metrics["sampling/groups_drawn"] == 8.0
    assert summary({"reward_sum": 1.0}, 2) == {}


def test_when_the_draws_run_out_the_step_trains_on_what_it_has():
    draws = iter([fake_rollout("a", [[0, 1], [1, 1]])])
    result = fill_batch(lambda: next(draws), groups_wanted=4, max_draws=1, gather_counts=lambda n: [n, 0], rank=0,
                        pad_token_id=PAD)
    assert not result.full and result.groups_kept == 1 and result.trains and len(result.batch.samples) == 1


def test_a_rank_whose_share_is_nothing_hands_over_a_placeholder():
    draws = iter([fake_rollout("a", [[1, 1], [2, 2]])])
    result = fill_batch(lambda: next(draws), groups_wanted=2, max_draws=1, gather_counts=lambda n: [n, 2], rank=0,
                        pad_token_id=PAD)
    assert result.groups_kept == 0 and not result.trains and len(result.batch.samples) == 1 and result.full


def test_no_group_with_a_signal_anywhere_trains_on_the_last_draw():
    draws = iter([fake_rollout("a", [[1, 1], [2, 2]])])
    result = fill_batch(lambda: next(draws), groups_wanted=2, max_draws=1, gather_counts=single_rank, rank=0,
                        pad_token_id=PAD)
    assert result.groups_kept == 0 and result.trains and len(result.batch.samples) == 2 and not result.full


def test_concat_repads_prompts_left_and_responses_right():
    a = fake_rollout("a", [[0, 1]], prompt_width=2, response_width=3)
    b = fake_rollout("b", [[1, 0]], prompt_width=4, response_width=2)
    both = concat([a, b], PAD)
    batch = both.batch
    assert batch.prompt_length == 4 and batch.response_mask.shape == (4, 3)
    assert batch.input_ids.shape == batch.attention_mask.shape == (4, 7)
    # a's rows: two more left pads, same tokens; b's rows: one more right pad, masked out
    assert batch.input_ids[0].tolist() == [PAD, PAD, PAD, 100, 100, 100, 0]
    assert batch.attention_mask[0].tolist() == [0, 0, 0, 1, 1, 1, 0]
    assert batch.input_ids[2].tolist() == [PAD, 200, 200, 200, 200, 0, PAD]
    assert batch.response_mask[2].tolist() == [1, 0, 0] and batch.attention_mask[2, -1] == 0
    assert both.rewards.tolist() == [0, 1, 1, 0] and both.by_function.shape == (1, 4)
    assert select_groups(both, [1]).batch.responses == ["b0", "b1"]


def short(prompt, response, answer):
    return 1.0 if len(response) <= 2 else 0.0


def exact(prompt, response, answer):
    return float(response == answer)


def test_scores_per_function_with_weights_and_the_overlong_penalty():
    rewards = [Reward("m:short", short, "simple", 2.0), Reward("m:exact", exact, "simple", 1.0)]
    batch = fake_rollout("a", [[0, 0]], response_width=8).batch
    batch.responses = ["ab", "abcd"]
    batch.response_mask = torch.tensor([[1] * 3 + [0] * 5, [1] * 8])  # 3 and 8 tokens
    samples = [Sample(prompt="p", answer="ab")]
    scored = score_rollout(rewards, samples, batch, n=2, max_new_tokens=8, overlong_buffer_len=4,
                           overlong_penalty_factor=1.0)
    # short: 1, 0 (x2); exact: 1, 0; penalty: 3 tokens free, 8 tokens -(8 - 4) / 4 = -1
    assert scored.by_function.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert scored.rewards.tolist() == [3.0, -1.0] and scored.overlong.tolist() == [0.0, -1.0]
    names = metric_names(rewards)
    assert names == ["reward/short", "reward/exact"]
    totals = rollout_sums([scored], overlong=True)
    assert reward_metrics(totals, names) == {"reward/short": 0.5, "reward/exact": 0.5, "overlong_penalty": -0.5,
                                             "overlong_frac": 0.5}
    records = sample_records(7, scored, torch.tensor([1.0, -1.0]), prompts=1, names=names)
    assert [r["response"] for r in records] == ["ab", "abcd"] and records[1]["advantage"] == -1.0
    assert records[0]["rewards"] == {"short": 1.0, "exact": 1.0} and records[1]["overlong_penalty"] == -1.0
    assert records[0]["step"] == 7 and records[0]["response_tokens"] == 3
    assert sample_records(7, scored, torch.zeros(2), prompts=0, names=names) == []


def test_two_functions_with_one_name_are_told_apart_by_their_spec():
    rewards = [Reward("a.m:short", short, "simple"), Reward("b.m:short", short, "simple")]
    assert metric_names(rewards) == ["reward/a.m:short", "reward/b.m:short"]
