"""The GRPO loop, run by every rank: rollout -> rewards -> advantages -> old/ref log-probs -> PPO updates.

Each rank samples its own prompts and all ``n`` responses of each, so whole groups stay on one rank and group
advantages need no communication. Updates go through ``FSDPEngine.forward_backward_batch`` (deferred gradient
sync) and ``optimizer_step``; metrics are averaged over ranks through the backend.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import accel_backends

from .. import FSDPEngine, checkpoint, launch
from ..phase import phase
from ..reduce import sum_over_ranks
from . import report
from .algorithms import aggregate_loss, grpo_advantages, kl_penalty, policy_loss
from .config import BUILTIN_MODEL, GRPOConfig, engine_config
from .rollout import RolloutBatch, batched_log_probs, response_log_probs, rollout
from .tasks import BUILTIN_REWARDS, build_task, load_reward_fn, score


def build_model(config: GRPOConfig):
    """(tokenizer, model factory): the built-in tiny char model, or a local Hugging Face directory."""
    if config.model.path == BUILTIN_MODEL:
        from .tasks import EchoTask
        from .tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer(EchoTask.alphabet)

        def factory():
            from transformers import Qwen2Config, Qwen2ForCausalLM

            hidden = config.model.hidden_size
            return Qwen2ForCausalLM(Qwen2Config(
                vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                num_hidden_layers=config.model.layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))

        return tokenizer, factory

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model.path, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, lambda: AutoModelForCausalLM.from_pretrained(config.model.path, torch_dtype=torch.float32)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (directories are named step_NNNNNN)."""
    return checkpoint.latest_complete(run_dir / "checkpoints")


@dataclasses.dataclass
class StepData:
    """One rank's training data for a step (host tensors, sliced into micro-batches by ``rows``)."""

    batch: RolloutBatch
    advantages: torch.Tensor
    old_log_probs: torch.Tensor
    ref_log_probs: torch.Tensor | None

    def micro_batch(self, rows: slice) -> dict:
        return {"input_ids": self.batch.input_ids[rows], "attention_mask": self.batch.attention_mask[rows],
                "response_mask": self.batch.response_mask[rows], "advantages": self.advantages[rows],
                "old_log_probs": self.old_log_probs[rows],
                "ref_log_probs": None if self.ref_log_probs is None else self.ref_log_probs[rows]}


class GRPOTrainer:
    def __init__(self, config: GRPOConfig, run_dir: Path, resume: bool) -> None:
        self.config = config
        self.run_dir = run_dir
        self.backend = accel_backends.get_backend()
        self.tokenizer, factory = build_model(config)
        self.task = build_task(config.data.task, config.data.path)
        self.reward_fn = load_reward_fn(config.data.reward or BUILTIN_REWARDS[config.data.task])
        world_size = self.backend.init_distributed(timeout=engine_config(config, 1).dist_timeout_s).world_size
        launch.stop_at_safe_point(config.run.save_on_interrupt)
        self.actor = FSDPEngine(factory, engine_config(config, world_size), self.backend)
        self.reference = None
        if config.algorithm.kl_coef > 0:
            self.reference = FSDPEngine(factory, engine_config(config, world_size, frozen=True), self.backend)
        self.rank, self.world_size = self.actor.rank, self.actor.world_size
        self.start_step = self._resume() if resume else 0

    # -- checkpoints --------------------------------------------------------------------------------------------

    def checkpoint_dir(self, step: int) -> Path:
        return self.run_dir / "checkpoints" / f"step_{step:06d}"

    def _resume(self) -> int:
        """Load the latest checkpoint; return the GRPO step it was taken after (its directory's number)."""
        loaded = checkpoint.load_latest(self.actor, self.run_dir / "checkpoints", self.config.run.resume_fallback)
        return checkpoint.step_of(loaded)

    # -- one step -----------------------------------------------------------------------------------------------

    def _seed(self, step: int) -> torch.Generator:
        """Per-step, per-rank randomness: a resumed run samples exactly what an uninterrupted one would."""
        seed = (self.config.train.seed * 1_000_003 + step) * 1009 + self.rank
        torch.manual_seed(seed)
        return torch.Generator().manual_seed(seed)

    def collect(self, step: int) -> tuple[StepData, dict]:
        cfg, roll = self.config, self.config.rollout
        prompts_per_rank = cfg.train.prompts_per_step // self.world_size
        samples = self.task.sample(prompts_per_rank, self._seed(step))
        with self.actor.eval_mode(), phase("rollout"):
            batch = rollout(self.actor, self.tokenizer, [s.prompt for s in samples], roll.n, roll.max_new_tokens,
                            roll.temperature, roll.top_p)
            old = batched_log_probs(self.actor, batch, cfg.train.micro_batch_size, roll.temperature)
        with phase("reward"):
            scores = torch.tensor([score(self.reward_fn, samples[i // roll.n], text)
                                   for i, text in enumerate(batch.responses)])
        groups = torch.arange(len(batch)) // roll.n
        advantages = grpo_advantages(scores, groups, norm_by_std=cfg.algorithm.norm_by_std)
        ref = None
        if self.reference is not None:
            with self.reference.eval_mode():
                ref = batched_log_probs(self.reference, batch, cfg.train.micro_batch_size, roll.temperature)
        stats = {"reward_sum": scores.sum().item(), "reward_sq_sum": (scores ** 2).sum().item(),
                 "sequences": float(len(batch)), "response_tokens": batch.response_mask.sum().item()}
        return StepData(batch, advantages, old, ref), stats

    def _step_fn(self, module, micro: dict):
        algo, device = self.config.algorithm, self.backend.device()
        mask = micro["response_mask"].to(device)
        prompt_length = micro["input_ids"].size(1) - micro["response_mask"].size(1)
        log_probs = response_log_probs(module, micro["input_ids"].to(device), micro["attention_mask"].to(device),
                                       prompt_length, self.config.rollout.temperature)
        loss, metrics = policy_loss(log_probs, micro["old_log_probs"].to(device), micro["advantages"].to(device),
                                    mask, clip_low=algo.clip_low, clip_high=algo.clip_high, clip_c=algo.clip_c,
                                    agg=algo.loss_agg)
        metrics = {"pg_loss": loss.item(), "clip_frac": metrics["clip_frac"], "approx_kl": metrics["approx_kl"]}
        if micro["ref_log_probs"] is not None:
            kl = aggregate_loss(kl_penalty(log_probs, micro["ref_log_probs"].to(device), algo.kl_kind), mask,
                                algo.loss_agg)
            loss = loss + algo.kl_coef * kl
            metrics["kl"] = kl.item()
        weight = mask.sum() if algo.loss_agg.startswith("token") else mask.size(0)
        return loss, weight, metrics

    def update(self, data: StepData) -> dict:
        train = self.config.train
        totals: dict[str, float] = {}
        updates, peak_gib = 0, 0.0
        with self.actor.train_mode():
            for _ in range(train.ppo_epochs):
                for start in range(0, len(data.batch), train.mini_batch_size):
                    micro_batches = [data.micro_batch(slice(s, s + train.micro_batch_size))
                                     for s in range(start, start + train.mini_batch_size, train.micro_batch_size)]
                    metrics = self.actor.forward_backward_batch(micro_batches, self._step_fn)
                    # Each call measures its own peak (the engine resets it): keep the largest, do not average.
                    peak_gib = max(peak_gib, metrics.pop("peak_memory_gib"))
                    metrics["grad_norm"] = self.actor.optimizer_step()
                    metrics["lr"] = self.actor.last_step_metrics["lr"]
                    metrics["skipped_updates"] = float(self.actor.last_step_metrics["skipped"])
                    for key, value in metrics.items():
                        totals[key] = totals.get(key, 0.0) + value
                    updates += 1
        averaged = {key: value / updates for key, value in totals.items()}
        averaged["skipped_updates"] = totals["skipped_updates"]  # a count, not a mean
        averaged["updates"] = float(updates)
        averaged["peak_memory_gib"] = peak_gib
        return averaged

    def _global(self, stats: dict) -> dict:
        return sum_over_ranks(stats, self.backend.metrics_device(), dtype=torch.float64)

    def _largest_over_ranks(self, value: float) -> float:
        packed = torch.tensor([value], dtype=torch.float64, device=self.backend.metrics_device())
        dist.all_reduce(packed, op=dist.ReduceOp.MAX)
        return packed.item()

    def train(self) -> dict:
        cfg = self.config
        log = report.MetricsLog(self.run_dir / "metrics.jsonl", self.start_step) if self.rank == 0 else None
        progress = None
        if self.rank == 0 and cfg.run.progress:
            from tqdm import tqdm

            progress = tqdm(total=cfg.train.steps, initial=self.start_step, desc="grpo", file=sys.stderr,
                            dynamic_ncols=True)
        last = {}
        for step in range(self.start_step, cfg.train.steps):
            started = time.perf_counter()
            self.backend.reset_peak_memory_stats()
            data, stats = self.collect(step)
            rollout_peak_gib = (self.backend.memory_stats().peak_allocated or 0) / 2**30
            rollout_done = time.perf_counter()
            update = self.update(data)
            finished = time.perf_counter()
            totals = self._global({**stats, "stop_requested": float(launch.stop_requested() > 0)})
            count = totals["sequences"]
            mean = totals["reward_sum"] / count
            last = {
                "step": step + 1,
                "reward_mean": mean,
                "reward_std": math.sqrt(max(totals["reward_sq_sum"] / count - mean * mean, 0.0)),
                "loss": update["loss"],
                "pg_loss": update["pg_loss"],
                "kl": update.get("kl", 0.0),
                "clip_frac": update["clip_frac"],
                "approx_kl": update["approx_kl"],
                "grad_norm": update["grad_norm"],
                "lr": update["lr"],
                "updates": update["updates"],
                "skipped_updates": update["skipped_updates"],
                "response_length": totals["response_tokens"] / count,
                "tokens_per_s": totals["response_tokens"] / (finished - started),
                "rollout_time_s": rollout_done - started,
                "update_time_s": finished - rollout_done,
                "step_time_s": finished - started,
                "peak_memory_gib": self._largest_over_ranks(max(rollout_peak_gib, update["peak_memory_gib"])),
            }
            if log is not None:
                log.write(last)
            if progress is not None:
                progress.set_postfix(reward=f"{mean:.3f}", step_s=f"{last['step_time_s']:.2f}")
                progress.update(1)
            save_every = cfg.run.save_every
            stopping = totals["stop_requested"] > 0  # summed over ranks: every rank stops at this same step
            if (save_every and (step + 1) % save_every == 0) or step + 1 == cfg.train.steps or stopping:
                self.actor.save_checkpoint(self.checkpoint_dir(step + 1))
            if stopping:
                break
        if progress is not None:
            progress.close()
        if self.rank == 0:
            report.plot_curves(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png")
        return last
