"""The loss types in the trainer on 2 real gloo ranks (built-in model, echo prompts): each recipe's loss over the
global batch equals its formula, every loss type trains with ppo_epochs=2 (old log-probs computed and used), DAPO
dynamic sampling refills the batch when all of one rank's first groups are filtered (no hang), the batch-wide
reward std, the entropy bonus and masked truncated responses. One spawn runs all the checks."""

import math

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow

PROMPTS_PER_RANK, N = 2, 4
BASE = [f"train.prompts_per_step={2 * PROMPTS_PER_RANK}", f"rollout.n={N}", "train.mini_batch_size=4",
        "train.micro_batch_size=2", "train.ppo_epochs=2", "rollout.max_new_tokens=4", "run.progress=false",
        "data.reward=grpo_rewards:flat_first_draw_on_rank1", "algorithm.filter_groups=true",
        "algorithm.max_gen_batches=3", "algorithm.kl_loss_coef=0.01", "run.log_samples=100"]
LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "gspo", "cispo")


def _expected_pg_losses(everyone, max_new_tokens):
    """Each recipe's policy loss at ratio 1 (before any update), over both ranks' micro-batches, by hand."""
    import torch

    advantages = torch.cat([d["advantages"] for d in everyone])
    mask = torch.cat([d["mask"] for d in everyone]).double()
    old = torch.cat([d["old"] for d in everyone]).double()
    lengths = mask.sum(1)
    per_seq_minus_a = -advantages.double() * (lengths > 0)  # a sequence's token mean of -A (0 without tokens)
    token_mean = (-advantages.double()[:, None] * mask).sum() / mask.sum()
    micro_means = []  # bnpo: each micro-batch of 2 sequences weighs the same
    for d in everyone:
        for rows in (slice(s, s + 2) for s in range(0, len(d["mask"]), 2)):
            m = d["mask"][rows].double()
            micro_means.append((-d["advantages"][rows].double()[:, None] * m).sum() / m.sum().clamp(min=1))
    return {
        "grpo": per_seq_minus_a.mean().item(),
        "dapo": token_mean.item(),
        "dr_grpo": (-advantages.double() * lengths / max_new_tokens).mean().item(),
        "bnpo": torch.stack(micro_means).mean().item(),
        "gspo": per_seq_minus_a.mean().item(),
        "cispo": ((-advantages.double()[:, None] * old * mask).sum() / mask.sum()).item(),  # -A log_prob, r = 1
    }


def _use(trainer, loss_type, **settings):
    a = trainer.config.algorithm
    a.loss_type, a.loss_agg, a.clip_low, a.clip_high, a.scale_rewards = loss_type, None, None, None, None
    a.entropy_coeff, a.mask_truncated = settings.get("entropy_coeff", 0.0), settings.get("mask_truncated", False)
    if "scale_rewards" in settings:
        a.scale_rewards = settings["scale_rewards"]


def _checks(rank, tmp):
    from pathlib import Path

    import torch.distributed as dist

    from engine.grpo.config import build_config
    from engine.grpo.trainer import GRPOTrainer

    out = {}
    trainer = GRPOTrainer(build_config(None, None, BASE), Path(tmp), resume=False)

    # -- dynamic sampling: rank 1's first draw has only equal rewards; both ranks draw again, then train --------
    data, stats = trainer.collect(step=0)
    out["sampling"] = {key: value for key, value in stats.items() if key.startswith("sampling/")}
    out["rows"] = len(data.batch)
    out["has_signal"] = all(len(set(g.tolist())) > 1 for g in data.advantages.view(-1, N))

    # -- every recipe's policy loss on this data, at ratio 1, against its formula over both ranks --------------
    micro = [data.micro_batch(slice(s, s + 2)) for s in range(0, len(data.batch), 2)]
    mine = {"advantages": data.advantages, "mask": data.batch.response_mask, "old": data.old_log_probs}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    out["pg_loss"] = {}
    with trainer.actor.train_mode():
        for loss_type in LOSS_TYPES:
            _use(trainer, loss_type)
            out["pg_loss"][loss_type] = trainer.actor.forward_backward_batch(micro, trainer._step_fn,
                                                                             forward_only=True)["pg_loss"]
    out["pg_loss_expected"] = _expected_pg_losses(everyone, max_new_tokens=4)

    # -- one step of each loss type with ppo_epochs=2 (filter_groups stays on) ---------------------------------
    out["steps"] = {}
    for step, name in enumerate((*LOSS_TYPES, "dapo-masked"), start=1):
        loss_type = name.split("-")[0]
        settings = {"cispo": {"entropy_coeff": 0.05}, "dapo-masked": {"mask_truncated": True},
                    "dr_grpo": {"scale_rewards": "batch"}}.get(name, {})
        _use(trainer, loss_type, **settings)
        data, stats = trainer.collect(step)
        result = {"old_used": data.old_log_probs is not None and data.old_log_probs.shape == data.batch.response_mask
                  .shape}
        if settings.get("mask_truncated"):
            result["truncated_tokens_left"] = data.batch.response_mask[data.batch.clipped].sum().item()
            result["all_truncated"] = trainer._smallest_over_ranks([float(data.batch.clipped.all())])[0] == 1.0
        if settings.get("scale_rewards") == "batch":  # run.log_samples=100: the records hold every response
            pairs = [None] * dist.get_world_size()
            dist.all_gather_object(pairs, [(r["reward"], r["advantage"]) for r in trainer.sample_records])
            result["reward_advantage"] = [pair for rank_pairs in pairs for pair in rank_pairs]
        update = trainer.update(data)
        result.update({key: update[key] for key in ("loss", "pg_loss", "kl", "clip_frac", "approx_kl", "entropy",
                                                     "grad_norm", "updates")})
        out["steps"][name] = result
    return out


def test_loss_types_on_two_ranks(tmp_path):
    flat = str(PROMPTS_PER_RANK * N)  # rank 1's first draw: every response 0.0
    results = run_ranks(_checks, str(tmp_path), env={"GRPO_FLAT_CALLS": flat})
    for rank, out in enumerate(results):
        sampling = out["sampling"]
        assert sampling["sampling/draws"] == 2.0, (rank, sampling)  # both ranks drew twice: rank 1 had to
        assert sampling["sampling/batch_full"] == 1.0 and sampling["sampling/groups_kept"] == PROMPTS_PER_RANK
        assert out["rows"] == PROMPTS_PER_RANK * N and out["has_signal"]
        if rank == 1:
            assert sampling["sampling/groups_filtered"] >= PROMPTS_PER_RANK, sampling
        for loss_type, got in out["pg_loss"].items():
            assert got == pytest.approx(out["pg_loss_expected"][loss_type], rel=1e-4, abs=1e-5), (loss_type, out)
        steps = out["steps"]
        for loss_type in LOSS_TYPES:
            step = steps[loss_type]
            assert step["old_used"] and step["updates"] == 4.0, (loss_type, step)  # 2 epochs x 2 mini-batches
            for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy"):
                assert math.isfinite(step[key]), (loss_type, key, step)
            assert step["approx_kl"] != 0.0, (loss_type, step)  # the second epoch sees a changed policy
            bonus = 0.05 * step["entropy"] if loss_type == "cispo" else 0.0  # token-mean: the metric's mean
            assert step["loss"] == pytest.approx(step["pg_loss"] + 0.01 * step["kl"] - bonus, rel=1e-4, abs=1e-6)
        assert steps["gspo"]["clip_frac"] > 0  # its clip range is 3e-4 / 4e-4
        masked = steps["dapo-masked"]
        assert masked["truncated_tokens_left"] == 0 and masked["updates"] == 4.0
        if masked["all_truncated"]:  # the tiny model rarely ends before 4 tokens: nothing to learn, no error
            assert masked["loss"] == 0.0 and masked["grad_norm"] == 0.0, masked
        # scale_rewards=batch: centred per group, divided by the std of every reward of both ranks
        pairs = out["steps"]["dr_grpo"]["reward_advantage"]
        rewards = [reward for reward, _ in pairs]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        for start in range(0, len(pairs), N):
            group = rewards[start:start + N]
            for reward, advantage in pairs[start:start + N]:
                assert advantage == pytest.approx((reward - sum(group) / N) / (std + 1e-6), abs=1e-5)
    assert results[0]["pg_loss"] == results[1]["pg_loss"]
