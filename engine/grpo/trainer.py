"""The GRPO loop, run by every rank: rollout -> old/ref log-probs -> rewards -> advantages -> PPO updates ->
validation -> metrics.

Each rank samples its own prompts and all ``n`` responses of each, so whole groups stay on one rank and group
advantages need no communication. Then every rank receives the whole step's batch once (``batches.py``):
mini-batches are global, and each is planned into micro-batches (packed, within a token budget, ranks balanced by
tokens) that the old/ref log-prob passes and the update share. Updates go through
``FSDPEngine.forward_backward_batch`` (deferred gradient sync) and ``optimizer_step``; metrics are averaged over
ranks through the backend. Data files, reward styles, sampling, log-probs, validation and loggers live in their
own modules (see ``docs/grpo.md``).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import accel_backends

from .. import FSDPEngine, checkpoint, runtime
from ..runtime import phase, sum_over_ranks
from .algorithms import aggregate_loss, grpo_advantages, kl_penalty, micro_batch_scale, policy_loss
from .batches import StepData, batching_for, gather_step_data, rank_sequences
from .config import GRPOConfig, deprecation_notices, dist_timeout_s, engine_config, updates_per_step
from .loggers import Loggers
from .logprobs import planned_log_probs, sequence_log_probs
from .model import build_model
from .report import plot_curves
from .rewards import load_rewards, score_all
from .rollout import rollout
from .tasks import build_tasks, reward_specs
from .validation import validate


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (directories are named step_NNNNNN)."""
    return checkpoint.latest_complete(run_dir / "checkpoints")


class GRPOTrainer:
    def __init__(self, config: GRPOConfig, run_dir: Path, resume: bool) -> None:
        self.config = config
        self.run_dir = run_dir
        self.backend = accel_backends.get_backend()
        world_size = self.backend.init_distributed(timeout=dist_timeout_s(config)).world_size
        runtime.stop_at_safe_point(config.run.save_on_interrupt)
        self.tokenizer, factory = build_model(config.model)
        self.task, self.val_samples = build_tasks(config.data, self.tokenizer, config.train.seed, verbose=False)
        self.rewards = load_rewards(reward_specs(config.data), config.data.reward_style)
        actor_config = engine_config(config, world_size)
        self.actor = FSDPEngine(factory, actor_config, self.backend)
        # With LoRA the reference is the actor's own base model, adapters disabled: no second copy of the weights.
        self.reference = None
        if config.algorithm.kl_coef > 0 and actor_config.lora_rank == 0:
            self.reference = FSDPEngine(factory, engine_config(config, world_size, frozen=True), self.backend)
        self.rank, self.world_size = self.actor.rank, self.actor.world_size
        train = config.train
        # One optimizer update per step: at update time the policy IS the rollout policy, so its own log-probs,
        # detached, are the old ones (the ratio is exactly 1) and the separate old-log-prob forward is skipped.
        self.reuse_policy_log_probs = updates_per_step(config, world_size) == 1
        # Packed micro-batches when asked for and the model's attention keeps packed sequences apart (a probe).
        self.packed = train.padding_free and self.actor.packed_input_supported()
        self.batching = batching_for(config, world_size, self.packed)
        if self.rank == 0:
            for notice in deprecation_notices(config, world_size):
                print(f"accel-grpo: note: {notice}", file=sys.stderr, flush=True)
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
                            roll.temperature, roll.top_p, roll.top_k)
        with phase("reward"):
            scores = torch.tensor(score_all(self.rewards, [samples[i // roll.n] for i in range(len(batch))],
                                            batch.responses))
        groups = torch.arange(len(batch)) // roll.n
        advantages = grpo_advantages(scores, groups, norm_by_std=cfg.algorithm.norm_by_std)
        # Every rank's sequences, on every rank: global mini-batches, each planned into every rank's micro-batches.
        data = gather_step_data(rank_sequences(batch, advantages), self.batching, self.rank, self.world_size,
                                self.backend.metrics_device())
        if not self.reuse_policy_log_probs:
            with self.actor.eval_mode():
                data.old_log_probs = planned_log_probs(self.actor, data, roll.temperature, "old")
        if cfg.algorithm.kl_coef > 0:
            data.ref_log_probs = self.reference_log_probs(data)
        lengths = batch.response_mask.sum(dim=1)
        stats = {"reward_sum": scores.sum().item(), "reward_sq_sum": (scores ** 2).sum().item(),
                 "sequences": float(len(batch)), "response_tokens": lengths.sum().item(),
                 "clipped": batch.clipped.sum().item()}
        self._longest_response = float(lengths.max().item())
        self.sample_record = {"step": step + 1, "prompt": samples[0].prompt, "response": batch.responses[0],
                              "reward": scores[0].item(), "response_tokens": int(lengths[0]),
                              "ended_by_eos": not bool(batch.clipped[0]) and int(lengths[0]) > 0}
        return data, stats

    def reference_log_probs(self, data: StepData) -> torch.Tensor:
        """Log-probs under the frozen reference: its own engine, or (LoRA) the actor with adapters disabled."""
        temperature = self.config.rollout.temperature
        if self.reference is not None:
            with self.reference.eval_mode():
                return planned_log_probs(self.reference, data, temperature, "ref")
        from peft import PeftModel

        peft_model = next(m for m in self.actor.module.modules() if isinstance(m, PeftModel))
        with self.actor.eval_mode(), peft_model.disable_adapter():
            return planned_log_probs(self.actor, data, temperature, "ref")

    def _step_fn(self, module, micro: dict):
        algo, device = self.config.algorithm, self.backend.device()
        layout = micro["layout"].to(device)
        mask = micro["loss_mask"].to(device)
        log_probs, entropy = sequence_log_probs(module, layout, self.config.rollout.temperature, with_entropy=True)
        old = log_probs.detach() if micro["old_log_probs"] is None else micro["old_log_probs"].to(device)
        loss, metrics = policy_loss(log_probs, old, micro["advantages"].to(device), mask, clip_low=algo.clip_low,
                                    clip_high=algo.clip_high, clip_c=algo.clip_c, agg=algo.loss_agg)
        # Normalisers over the whole mini-batch: every micro-batch of every rank; a filler counts for nothing.
        scale, weight = micro_batch_scale(mask, algo.loss_agg, micro["micro_batches"])
        if layout.filler:
            weight = weight * 0.0
        metrics = {"pg_loss": loss.item() * scale, "clip_frac": metrics["clip_frac"],
                   "approx_kl": metrics["approx_kl"], "entropy": aggregate_loss(entropy, mask, "token-mean").item()}
        if micro["ref_log_probs"] is not None:
            kl = aggregate_loss(kl_penalty(log_probs, micro["ref_log_probs"].to(device), algo.kl_kind), mask,
                                algo.loss_agg)
            loss = loss + algo.kl_coef * kl
            metrics["kl"] = kl.item() * scale
        return loss * scale, weight, metrics

    def update(self, data: StepData) -> dict:
        train = self.config.train
        totals: dict[str, float] = {}
        updates, peak_gib = 0, 0.0
        with self.actor.train_mode():
            for _ in range(train.ppo_epochs):
                for mini in data.mini_batches:
                    metrics = self.actor.forward_backward_batch(data.micro_batches(mini), self._step_fn)
                    metrics.pop("peak_memory_gib")  # covered by the step's figure below
                    metrics["grad_norm"] = self.actor.optimizer_step()
                    # The step's peak covers the whole update (onload, forward/backward, the step); each update
                    # measures its own, so keep the largest, do not average.
                    peak_gib = max(peak_gib, self.actor.last_step_metrics["peak_memory_gib"])
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
        return sum_over_ranks(stats, self.backend.metrics_device())

    def _packing_metrics(self, data: StepData) -> dict:
        """The path that ran, micro-batches per update, token imbalance; pad tokens computed, summed over ranks."""
        pads = self._global({f"pad_tokens_{what}": float(data.pad_tokens.get(what, 0))
                             for what in ("update", "ref", "old")})
        return {**data.plan_metrics(), **pads}

    def _largest_over_ranks(self, value: float) -> float:
        packed = torch.tensor([value], dtype=torch.float64, device=self.backend.metrics_device())
        dist.all_reduce(packed, op=dist.ReduceOp.MAX)
        return packed.item()

    def _validate(self, step: int) -> dict:
        cfg = self.config
        every, last_step = cfg.run.val_every, step + 1 == cfg.train.steps
        if not self.val_samples or not (last_step or (every and (step + 1) % every == 0)):
            return {}
        return validate(self.actor, self.tokenizer, self.val_samples, self.rewards, cfg.rollout,
                        batch_prompts=max(1, cfg.train.prompts_per_step // self.world_size))

    def train(self) -> dict:
        cfg = self.config
        loggers = Loggers(cfg.run.loggers, self.run_dir, self.start_step) if self.rank == 0 else None
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
            totals = self._global({**stats, "stop_requested": float(runtime.stop_requested() > 0)})
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
                "entropy": update["entropy"],
                "grad_norm": update["grad_norm"],
                "lr": update["lr"],
                "updates": update["updates"],
                "skipped_updates": update["skipped_updates"],
                "response_length": totals["response_tokens"] / count,
                "response_length_max": self._largest_over_ranks(self._longest_response),
                "response_clip_frac": totals["clipped"] / count,
                "tokens_per_s": totals["response_tokens"] / (finished - started),
                "rollout_time_s": rollout_done - started,
                "update_time_s": finished - rollout_done,
                "step_time_s": finished - started,
                "peak_memory_gib": self._largest_over_ranks(max(rollout_peak_gib, update["peak_memory_gib"])),
            }
            last.update(self._packing_metrics(data))
            last.update(self._validate(step))
            if loggers is not None:
                loggers.write(last)
                loggers.write_sample(self.sample_record)
            if progress is not None:
                shown = {"reward": f"{mean:.3f}", "step_s": f"{last['step_time_s']:.2f}"}
                if "val/accuracy" in last:
                    shown["val_acc"] = f"{last['val/accuracy']:.3f}"
                progress.set_postfix(shown)
                progress.update(1)
            save_every = cfg.run.save_every
            stopping = totals["stop_requested"] > 0  # summed over ranks: every rank stops at this same step
            if (save_every and (step + 1) % save_every == 0) or step + 1 == cfg.train.steps or stopping:
                self.actor.save_checkpoint(self.checkpoint_dir(step + 1))
            if stopping:
                break
        if progress is not None:
            progress.close()
        if loggers is not None:
            loggers.close()
            plot_curves(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png")
        return last
