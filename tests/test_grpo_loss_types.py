"""The loss types in the trainer on 2 real gloo ranks (built-in model, echo prompts): each recipe's loss over the
global batch equals its formula, every loss type trains with ppo_epochs=2 (old log-probs computed and used), DAPO
dynamic sampling refills the batch when all of one rank's first groups are filtered (no hang), the batch-wide
reward std, the entropy bonus and masked truncated responses; the advantage estimators (algorithm.advantage), both
as public functions and in the trainer's step, normalised over the global batch of both ranks. One spawn (a module
fixture) runs all the checks; each test asserts one property of its results, so that one failure does not hide the
others."""

import math

import advantage_formulas as formulas
import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow

PROMPTS_PER_RANK, N = 2, 4
BASE = [f"train.prompts_per_step={2 * PROMPTS_PER_RANK}", f"rollout.n={N}", "train.prompts_per_update=2",
        "train.micro_batch_size=2", "train.ppo_epochs=2", "rollout.max_new_tokens=4", "run.progress=false",
        "data.reward=grpo_rewards:flat_first_draw_on_rank1", "algorithm.filter_groups=true",
        "algorithm.max_gen_batches=3", "algorithm.kl_loss_coef=0.01", "run.log_samples=100"]
LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "gspo", "cispo")


def _expected_pg_loss(data, mini, old, max_new_tokens):
    """Each recipe's policy loss at ratio 1 (before any update) over one global mini-batch, by hand."""
    import torch

    rows = list(mini.indices)
    advantages, mask, old = data.advantages[rows].double(), data.loss_mask[rows].double(), old[rows].double()
    lengths = mask.sum(1)
    per_seq_minus_a = -advantages * (lengths > 0)  # a sequence's token mean of -A (0 without tokens)
    token_mean = (-advantages[:, None] * mask).sum() / mask.sum()
    micro_means = []  # bnpo: each micro-batch of every rank weighs the same
    for micro in (m for ranks in mini.plan.ranks for m in ranks if m):
        m = data.loss_mask[list(micro)].double()
        micro_means.append((-data.advantages[list(micro)].double()[:, None] * m).sum() / m.sum().clamp(min=1))
    return {
        "grpo": per_seq_minus_a.mean().item(),
        "dapo": token_mean.item(),
        "dr_grpo": (-advantages * lengths / max_new_tokens).mean().item(),
        "bnpo": torch.stack(micro_means).mean().item(),
        "gspo": per_seq_minus_a.mean().item(),
        "cispo": ((-advantages[:, None] * old * mask).sum() / mask.sum()).item(),  # -A log_prob, r = 1
    }


def _use(trainer, loss_type, **settings):
    a = trainer.config.algorithm
    a.loss_type, a.loss_agg, a.clip_low, a.clip_high, a.scale_rewards = loss_type, None, None, None, None
    a.entropy_coeff, a.mask_truncated = settings.get("entropy_coeff", 0.0), settings.get("mask_truncated", False)
    if "scale_rewards" in settings:
        a.scale_rewards = settings["scale_rewards"]
    trainer.reconfigure()  # the loss type is resolved, and its terms built, once: again for the new keys


def _response_lengths(data):
    return (data.sequences.lengths - data.sequences.starts).tolist()


def _checks(rank, tmp):
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from engine.rl.algorithms.grpo.config import build_config
    from engine.train.registry import get_recipe

    out = {}
    trainer = get_recipe("grpo").trainer_of(build_config(None, None, BASE), Path(tmp), resume=False)

    # -- dynamic sampling: rank 1's first draw has only equal rewards; both ranks draw again, then train --------
    data, stats, _ = trainer.collect(step=0)
    out["sampling"] = {key: value for key, value in stats.items() if key.startswith("sampling/")}
    out["rows"] = len(data.advantages)  # the step's global batch: every rank's groups
    out["has_signal"] = all(len(set(g.tolist())) > 1 for g in data.advantages.view(-1, N))

    # -- every recipe's policy loss on this data, at ratio 1, against its formula over the global mini-batch ----
    old = data.old_log_probs.clone()  # this rank's rows; the other rows are the other rank's
    dist.all_reduce(old)
    out["pg_loss"], out["pg_loss_expected"] = {}, {}
    with trainer.actor.train_mode():
        for loss_type in LOSS_TYPES:
            _use(trainer, loss_type)
            got = [trainer.actor.forward_backward_batch(data.micro_batches(mini), trainer.loss_fn,
                                                        forward_only=True)["pg_loss"] for mini in data.mini_batches]
            out["pg_loss"][loss_type] = got
    out["pg_loss_expected"] = {loss_type: [_expected_pg_loss(data, mini, old, max_new_tokens=4)[loss_type]
                                           for mini in data.mini_batches] for loss_type in LOSS_TYPES}

    # -- one step of each loss type with ppo_epochs=2 (filter_groups stays on) ---------------------------------
    out["steps"] = {}
    for step, name in enumerate((*LOSS_TYPES, "dapo-masked"), start=1):
        loss_type = name.split("-")[0]
        settings = {"cispo": {"entropy_coeff": 0.05}, "dapo-masked": {"mask_truncated": True},
                    "dr_grpo": {"scale_rewards": "batch"}}.get(name, {})
        _use(trainer, loss_type, **settings)
        data, stats, extras = trainer.collect(step)
        result = {"old_used": data.old_log_probs is not None and data.old_log_probs.shape == data.loss_mask.shape}
        if settings.get("mask_truncated"):  # a full-length response without EOS keeps no loss token
            eos = trainer.tokenizer.eos_token_id
            lengths, ends = _response_lengths(data), data.sequences.lengths.tolist()
            cut = [length == 4 and data.sequences.tokens[row, ends[row] - 1].item() != eos
                   for row, length in enumerate(lengths)]
            result["truncated_tokens_left"] = int(data.loss_mask[torch.tensor(cut, dtype=torch.bool)].sum())
            result["other_tokens_kept"] = all(int(data.loss_mask[row].sum()) == lengths[row]
                                              for row in range(len(cut)) if not cut[row])
            result["all_truncated"] = all(cut)
        if settings.get("scale_rewards") == "batch":  # run.log_samples=100: the records hold every response
            pairs = [None] * dist.get_world_size()
            dist.all_gather_object(pairs, [(r["reward"], r["advantage"]) for r in extras["samples"]])
            result["reward_advantage"] = [pair for rank_pairs in pairs for pair in rank_pairs]
        update = trainer.update(data)
        result.update({key: update[key] for key in ("loss", "pg_loss", "kl", "clip_frac", "approx_kl", "entropy",
                                                     "grad_norm", "updates")})
        out["steps"][name] = result
    out["estimators"] = _estimators(trainer, rank, first_step=len(out["steps"]) + 1)
    return out


ESTIMATOR_STEPS = {"rloo": {}, "reinforce_pp": {"kl_reward_coef": 0.05},
                   "reinforce_pp_baseline": {"kl_reward_coef": 0.05}, "reinforce_pp_baseline-outcome": {},
                   "grpo-normalize_then_sum": {"multi_reward": "normalize_then_sum"}}


def _gathered(tensor):
    """The step's [N, R] rows of every rank (each rank fills its own share, zeros elsewhere)."""
    import torch.distributed as dist

    whole = tensor.clone()
    dist.all_reduce(whole)
    return whole.tolist()


def _estimators(trainer, rank, first_step):
    """The public estimators on each rank's half of one batch (the figures of the whole are the test's), and the
    trainer's step at each ``algorithm.advantage`` with what it started from (the outcome, old and ref log-probs)."""
    import torch
    import torch.distributed as dist

    from engine.grpo.algorithms import reinforce_pp_advantages, reinforce_pp_baseline_advantages, rloo_advantages

    g = torch.Generator().manual_seed(3)
    rewards, mask = torch.randn(8, 5, generator=g), (torch.rand(8, 5, generator=g) > 0.3).long()
    mine, groups = slice(4 * rank, 4 * rank + 4), torch.arange(8) // 2  # whole groups on each rank
    out = {"public": {"reinforce_pp": reinforce_pp_advantages(rewards[mine], mask[mine], gamma=0.8).tolist(),
                      "reinforce_pp_baseline": reinforce_pp_baseline_advantages(rewards[mine], mask[mine],
                                                                                groups[mine]).tolist(),
                      "rloo": rloo_advantages(rewards[mine, 0], groups[mine]).tolist()},
           "inputs": {"rewards": rewards.tolist(), "mask": mask.tolist()}, "trainer": {}}
    _use(trainer, "dapo")  # the loss for every estimator step (the estimator's keys are read where used)
    algorithm, seen = trainer.algorithm, {}
    token_advantages, scores = algorithm.token_advantages, algorithm.scores

    def recording_scores(scored, *args):
        seen["scores"], seen["by_function"] = scores(scored, *args), scored.by_function
        return seen["scores"]

    def recording(data, context):  # what the per-token estimators start from
        seen["outcome"] = data.advantages.tolist()
        return token_advantages(data, context)

    algorithm.token_advantages, algorithm.scores = recording, recording_scores
    for step, (name, settings) in enumerate(ESTIMATOR_STEPS.items(), start=first_step):
        trainer.config.algorithm.advantage = name.split("-")[0]
        trainer.config.algorithm.kl_reward_coef = settings.get("kl_reward_coef", 0.0)
        trainer.config.algorithm.multi_reward = settings.get("multi_reward", "sum_then_normalize")
        seen.clear()
        data, _, _ = trainer.collect(step)
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, (seen["scores"].tolist(), seen["by_function"].tolist()))
        result = {"scores": [s for rank_scores, _ in every for s in rank_scores], "outcome": seen.get("outcome"),
                  "by_function": [[v for _, values in every for v in values[f]] for f in range(len(every[0][1]))],
                  "mask": data.loss_mask.tolist(), "old": _gathered(data.old_log_probs),
                  "ref": _gathered(data.ref_log_probs) if data.ref_log_probs is not None else None}
        result["advantages"] = _gathered(data.advantages) if data.advantages.dim() == 2 else data.advantages.tolist()
        update = trainer.update(data)  # per-token advantages through the loss
        result["update"] = {key: update[key] for key in ("loss", "pg_loss", "grad_norm")}
        out["trainer"][name] = result
    algorithm.token_advantages, algorithm.scores = token_advantages, scores
    trainer.config.algorithm.advantage, trainer.config.algorithm.kl_reward_coef = "grpo", 0.0
    trainer.config.algorithm.multi_reward = "sum_then_normalize"
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Both ranks' results of the one spawn; each test below checks one property of them."""
    flat = str(PROMPTS_PER_RANK * N)  # rank 1's first draw: every response 0.0
    return run_ranks(_checks, str(tmp_path_factory.mktemp("loss-types")), env={"GRPO_FLAT_CALLS": flat})


def test_dynamic_sampling_refills_the_batch_when_one_rank_filters_every_group(results):
    for rank, out in enumerate(results):
        sampling = out["sampling"]
        assert sampling["sampling/draws"] == 2.0, (rank, sampling)  # both ranks drew twice: rank 1 had to
        assert sampling["sampling/batch_full"] == 1.0 and sampling["sampling/groups_kept"] == PROMPTS_PER_RANK
        assert out["rows"] == 2 * PROMPTS_PER_RANK * N and out["has_signal"]
        if rank == 1:
            assert sampling["sampling/groups_filtered"] >= PROMPTS_PER_RANK, sampling


def test_each_recipes_global_loss_equals_its_formula(results):
    for out in results:
        for loss_type, got in out["pg_loss"].items():
            assert len(got) == 2, got  # 16 sequences, 8 per update
            assert got == pytest.approx(out["pg_loss_expected"][loss_type], rel=1e-4, abs=1e-5), (loss_type, out)
    assert results[0]["pg_loss"] == results[1]["pg_loss"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_type_trains_two_epochs_on_the_old_log_probs(results, loss_type):
    for out in results:
        step = out["steps"][loss_type]
        assert step["old_used"] and step["updates"] == 4.0, (loss_type, step)  # 2 epochs x 2 mini-batches
        for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy"):
            assert math.isfinite(step[key]), (loss_type, key, step)
        assert step["approx_kl"] != 0.0, (loss_type, step)  # the second epoch sees a changed policy
        bonus = 0.05 * step["entropy"] if loss_type == "cispo" else 0.0  # token-mean: the metric's mean
        assert step["loss"] == pytest.approx(step["pg_loss"] + 0.01 * step["kl"] - bonus, rel=1e-4, abs=1e-6)


def test_gspo_clips(results):
    for out in results:
        assert out["steps"]["gspo"]["clip_frac"] > 0  # its clip range is 3e-4 / 4e-4


def test_truncated_responses_are_masked(results):
    for out in results:
        masked = out["steps"]["dapo-masked"]
        assert masked["truncated_tokens_left"] == 0 and masked["other_tokens_kept"] and masked["updates"] == 4.0
        if masked["all_truncated"]:  # the tiny model rarely ends before 4 tokens: nothing to learn, no error
            assert masked["loss"] == 0.0 and masked["grad_norm"] == 0.0, masked


def test_batch_reward_scaling_divides_by_the_std_of_both_ranks_rewards(results):
    # scale_rewards=batch: centred per group, divided by the std of every reward of both ranks
    for out in results:
        pairs = out["steps"]["dr_grpo"]["reward_advantage"]
        rewards = [reward for reward, _ in pairs]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        for start in range(0, len(pairs), N):
            group = rewards[start:start + N]
            for reward, advantage in pairs[start:start + N]:
                assert advantage == pytest.approx((reward - sum(group) / N) / (std + 1e-6), abs=1e-5)


def _close(got, want: dict, rows=None):
    for (i, t), value in want.items():
        assert got[i][t] == pytest.approx(value, abs=2e-5), (i, t)
    for i, row in enumerate(got):  # nothing outside the loss tokens
        assert all(value == 0.0 for t, value in enumerate(row) if (i, t) not in want), i


def test_public_estimators_normalise_over_both_ranks_rows(results):
    first, second = (out["estimators"] for out in results)
    inputs = first["inputs"]
    rewards, mask, groups = inputs["rewards"], inputs["mask"], [i // 2 for i in range(8)]
    want = {"reinforce_pp": formulas.whiten(formulas.returns(rewards, mask, 0.8)),
            "reinforce_pp_baseline": formulas.whiten(formulas.baseline_centred(rewards, mask, groups))}
    for name, expected in want.items():
        got = first["public"][name] + second["public"][name]  # each rank's half, in order
        _close(got, expected)
    scores = [row[0] for row in rewards]
    rloo = first["public"]["rloo"] + second["public"]["rloo"]
    assert rloo == pytest.approx([scores[i] - scores[i ^ 1] for i in range(8)], abs=1e-6)  # groups of two


@pytest.mark.parametrize("name", ESTIMATOR_STEPS)
def test_the_trainers_estimators_follow_their_formulas_over_the_global_batch(results, name):
    got = results[0]["estimators"]["trainer"][name]
    assert results[1]["estimators"]["trainer"][name]["advantages"] == got["advantages"]  # every rank sees it alike
    mask, coef = got["mask"], ESTIMATOR_STEPS[name].get("kl_reward_coef", 0.0)
    groups = [i // N for i in range(len(mask))]
    if name == "rloo":
        scores = got["scores"]
        assert got["advantages"] == pytest.approx(
            [s - (sum(scores[g * N:(g + 1) * N]) - s) / (N - 1) for s, g in zip(scores, groups, strict=True)], abs=1e-6)
    elif name == "grpo-normalize_then_sum":  # GDPO: each reward normalised in its group, summed, then GRPO's
        normalised = [formulas.group_normalised(values, N) for values in got["by_function"]]
        scores = [sum(column) for column in zip(*normalised, strict=True)]
        assert got["scores"] == pytest.approx(scores, abs=1e-5)
        assert got["advantages"] == pytest.approx(formulas.group_normalised(scores, N), abs=1e-4)
    else:
        rewards = formulas.token_rewards(got["outcome"], mask, coef, got["old"], got["ref"])
        centred = (formulas.returns(rewards, mask, 1.0) if name == "reinforce_pp"
                   else formulas.baseline_centred(rewards, mask, groups))
        assert got["outcome"] == pytest.approx(got["scores"])  # the outcome is the sequence's score
        _close(got["advantages"], formulas.whiten(centred))
    for out in results:
        update = out["estimators"]["trainer"][name]["update"]
        assert all(math.isfinite(value) for value in update.values()), update
