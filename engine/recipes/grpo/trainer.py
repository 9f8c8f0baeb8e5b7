"""GRPO's parts and step, run by every rank inside the frame's loop (``engine/train/loop.py``): rollout -> old/ref
log-probs -> rewards -> advantages -> PPO updates; each step returns its figures (``StepResult``) for the loop to
reduce over ranks, log and checkpoint.

Each rank samples its own prompts and all ``n`` responses of each, so whole groups stay on one rank and group
advantages need no communication (with sequence parallelism: each group of ranks, ``groups.py``). Then every rank
receives the whole step's batch once (``batches.py``): mini-batches are global, and each is planned into
micro-batches (packed, within a token budget, ranks balanced by tokens) that the old/ref log-prob passes and the
update share. Updates go through
``FSDPEngine.forward_backward_batch`` (deferred gradient sync) and ``optimizer_step``; metrics are averaged over
ranks through the backend. Data files, reward styles, sampling, rollout engines, log-probs, validation and loggers
live in their own modules (see ``docs/grpo.md``).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import torch

import accel_backends

from ... import FSDPEngine, checkpoint, runtime
from ...rl import scoring
from ...rl.ahead import AheadSampling
from ...rl.algorithms import aggregate_loss, grpo_advantages, kl_penalty, micro_batch_scale, policy_loss
from ...rl.batches import StepData, batching_for, gather_step_data, rank_sequences
from ...rl.groups import MicroBatchShare, SamplingGroups
from ...rl.logprobs import planned_log_probs, sequence_log_probs
from ...rl.model import build_model
from ...rl.prompts import build_tasks, data_spec, needs_answers
from ...rl.reward_model import model_rewards
from ...rl.rewards import environment_rewards, load_rewards, metric_names
from ...rl.rollout_correction import MismatchStats, importance_weights
from ...rl.validation import validate
from ...rollout import (
    RolloutContext,
    build_sampler,
    create_rollout_engine,
    eos_token_ids,
    sampling_configs,
    sync_weights,
)
from ...rollout.borrowing import borrow_idle_cores
from ...rollout.staleness import synchronous_figures
from ...runtime import BorrowedThreads, phase, sum_over_ranks
from ...train.config import dist_timeout_s
from ...train.recipe import StepResult
from . import dynamic_sampling
from .config import GRPOConfig, deprecation_notices, engine_config, prompts_per_rank, updates_per_step
from .loss_types import resolve
from .step_metrics import shown, step_row


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (directories are named step_NNNNNN)."""
    return checkpoint.latest_complete(run_dir / "checkpoints")


def load_inputs(config: GRPOConfig, verbose: bool = False):
    """``(tokenizer, model factory, (task, validation samples), the data's rewards)``: the config enters data
    loading here, once (spec -> rewards -> prompts); bad input fails here with one line."""
    tokenizer, factory = build_model(config.model)
    spec = data_spec(config)
    rewards = load_rewards(list(spec.rewards), spec.reward_style)
    return tokenizer, factory, build_tasks(spec, tokenizer, needs_answers(rewards), verbose=verbose), rewards


class GRPOTrainer:
    """A GRPO run's parts on one rank: the actor (and reference) engines, the rollout engine, data and rewards."""

    def __init__(self, config: GRPOConfig, run_dir: Path | None = None, resume: bool = False, inputs=None) -> None:
        self.config = config
        self.run_dir, self.resume = run_dir, resume  # for train() only
        self.backend = accel_backends.get_backend()
        world_size = self.backend.init_distributed(timeout=dist_timeout_s(config)).world_size
        self.tokenizer, factory, (self.task, self.val_samples), file_rewards = inputs or load_inputs(config)
        # An environment's get_reward() is a reward of its own (then data.reward is optional).
        used = [] if config.rollout.environment and not config.data.reward else file_rewards
        self.rewards = used + environment_rewards(config.rollout.environment) + model_rewards(config, self.backend)
        self.reward_names = metric_names(self.rewards)
        actor_config = engine_config(config, world_size)
        self.actor = FSDPEngine(factory, actor_config, self.backend)
        # With LoRA the reference is the actor's own base model, adapters disabled: no second copy of the weights.
        self.reference = None
        if self.loss.kl_loss_coef > 0 and actor_config.lora_rank == 0:
            self.reference = FSDPEngine(factory, engine_config(config, world_size, frozen=True), self.backend)
        self.rank, self.world_size = self.actor.rank, self.actor.world_size
        self.prompts_per_rank = prompts_per_rank(config, world_size)  # each sequence-parallel group's, on its ranks
        self.groups = SamplingGroups(self.actor.sequence_parallel, self.backend.metrics_device())
        # One optimizer update per step: at update time the policy IS the rollout policy, so its own log-probs,
        # detached, are the old ones (the ratio is exactly 1) and the separate old-log-prob forward is skipped.
        self.reuse_policy_log_probs = updates_per_step(config, world_size) == 1
        # Packed micro-batches when asked for and the model's attention keeps packed sequences apart (a probe).
        self.packed = config.train.padding_free and self.actor.packed_input_supported()
        self.batching = batching_for(config, world_size, self.packed)
        if self.rank == 0:
            for notice in deprecation_notices(config, world_size):
                print(f"accel-grpo: note: {notice}", file=sys.stderr, flush=True)
        self.sampling, self.val_sampling = sampling_configs(config.rollout, eos_token_ids(self.actor.module,
                                                                                          self.tokenizer))
        self._mismatch: MismatchStats | None = None  # where loss_fn records the rollout mismatch, during update()
        from .config import max_sequence_tokens

        self.rollout_engine = create_rollout_engine(config.rollout.engine, RolloutContext(
            self.actor, self.tokenizer, factory, config.rollout, max_sequence_tokens(config)))
        # The engine's log-probs, for the mismatch metrics and algorithm.rollout_correction, where they are cheap.
        self.sampling = dataclasses.replace(self.sampling, log_probs=self.rollout_engine.cheap_log_probs)
        # Single-turn, or multi-turn with tools or an environment (every rank's engine calls in step): chosen once.
        self.sampler = build_sampler(config, self.tokenizer,
                                     lambda flag: runtime.on_any_rank(flag, self.backend.metrics_device()))
        sync_weights(self.actor, self.rollout_engine)  # an engine holding its own copy starts from the policy
        # rollout.max_staleness > 0: a thread samples the next steps' batches while this one trains (ready())
        bound = config.rollout.max_staleness
        self.ahead = AheadSampling(self, bound) if bound > 0 else None
        self.borrowing: BorrowedThreads | None = None  # rollout.vllm.borrow_threads, from ready() on

    @property
    def engine(self) -> FSDPEngine:
        """The engine the frame's loop checkpoints and resumes."""
        return self.actor

    @property
    def loss(self):
        """``algorithm.loss_type``'s recipe with the keys set explicitly, as concrete settings (``loss_types.py``)."""
        return resolve(self.config.algorithm, self.config.rollout.max_new_tokens)

    # -- checkpoints --------------------------------------------------------------------------------------------

    def checkpoint_dir(self, step: int) -> Path:
        return self.run_dir / "checkpoints" / f"step_{step:06d}"

    # -- one step -----------------------------------------------------------------------------------------------

    def _seed(self, step: int) -> torch.Generator:
        """Per-step, per-group randomness (the ranks of a sequence-parallel group draw the same prompts): a resumed
        run samples exactly what an uninterrupted one would."""
        torch.manual_seed(self._step_seed(step))
        return self.generator(step)

    def _step_seed(self, step: int) -> int:
        return (self.config.train.seed * 1_000_003 + step) * 1009 + self.groups.rank

    def generator(self, step: int) -> torch.Generator:
        """Step ``step``'s own generator on this rank (the sampler thread's too: never the global one)."""
        return torch.Generator().manual_seed(self._step_seed(step))

    def collect(self, step: int, ahead: tuple | None = None,
                dropped: torch.Tensor | None = None) -> tuple[StepData, dict, dict]:
        """Roll out (or take ``ahead``: samples and batch sampled by the sampler thread, ``dropped``: its rows too
        stale to train on), score and gather the step's batch: ``(data, this rank's sums, extras)`` where
        ``extras`` holds the longest response, the records for samples.jsonl and the seconds spent sampling."""
        cfg, roll, algo = self.config, self.config.rollout, self.config.algorithm
        generator = self._seed(step)
        sampling_s = [0.0]

        def draw() -> scoring.ScoredRollout:
            if ahead is not None:
                samples, batch = ahead
            else:
                samples = self.task.sample(self.prompts_per_rank, generator)
                with phase("rollout"):
                    began = time.perf_counter()
                    batch = self.sampler(self.rollout_engine, samples, self.sampling)
                    sampling_s[0] += time.perf_counter() - began
            with phase("reward"):
                return scoring.score_rollout(self.rewards, samples, batch, roll.n, roll.max_new_tokens,
                                             algo.overlong_buffer_len, algo.overlong_penalty_factor)

        sampling, trains = {}, True
        with self.actor.eval_mode():
            if algo.filter_groups:  # DAPO dynamic sampling: all ranks draw until the step's groups are found
                result = dynamic_sampling.fill_batch(draw, groups_wanted=cfg.train.prompts_per_step,
                                                     max_draws=algo.max_gen_batches,
                                                     gather_counts=self.groups.counts, rank=self.groups.rank,
                                                     pad_token_id=self.tokenizer.pad_token_id)
                scored, drawn, sampling, trains = result.batch, result.drawn, result.metrics(), result.trains
            else:
                scored = draw()
                drawn = [scored]
            batch = scored.batch
        groups = torch.arange(len(batch)) // roll.n
        scale, leads = self.loss.scale_rewards, trains and self.groups.leader  # a group's rows count once
        batch_std = self._batch_std(scored.rewards if leads else scored.rewards[:0]) if scale == "batch" else None
        advantages = grpo_advantages(scored.rewards, groups, scale=scale, batch_std=batch_std)
        drop = torch.zeros(len(batch), dtype=torch.bool) if dropped is None else dropped
        if algo.mask_truncated:  # responses cut at max_new_tokens get no loss (their attention is unchanged)
            drop = drop | batch.clipped
        if bool(drop.any()):  # and those too stale to train on (whole groups)
            keep = (~drop).unsqueeze(1).to(batch.response_mask.dtype)
            batch = dataclasses.replace(batch, response_mask=batch.response_mask * keep)
        # Every rank's sequences, on every rank: global mini-batches, each planned into every rank's micro-batches.
        data = gather_step_data(rank_sequences(batch, advantages, leads), self.batching, self.groups.rank,
                                self.groups.size, self.backend.metrics_device())
        if not self.reuse_policy_log_probs:
            with self.actor.eval_mode(), phase("old_log_probs"):
                data.old_log_probs = self._log_probs(self.actor, data, "old")
        if self.loss.kl_loss_coef > 0:
            with phase("ref_log_probs"):
                data.ref_log_probs = self.reference_log_probs(data)
        stats = self.groups.once({**scoring.rollout_sums(drawn, overlong=algo.overlong_buffer_len > 0), **sampling,
                                  "rollout_tokens_computed": float(sum(p.batch.tokens_computed for p in drawn))})
        extras = {"longest": max(float(part.lengths.max().item()) for part in drawn), "sampling_s": sampling_s[0],
                  "samples": scoring.sample_records(step + 1, scored, advantages,
                                                    cfg.run.log_samples if leads else 0, self.reward_names)}
        return data, stats, extras

    def _log_probs(self, engine: FSDPEngine, data: StepData, what: str) -> torch.Tensor:
        """Forward-only log-probs of this rank's share of the step, under the sampling distribution."""
        roll = self.config.rollout
        return planned_log_probs(engine, data, roll.temperature, what, top_k=roll.top_k, top_p=roll.top_p)

    def reference_log_probs(self, data: StepData) -> torch.Tensor:
        """Log-probs under the frozen reference: its own engine, or (LoRA) the actor with adapters disabled."""
        if self.reference is not None:
            with self.reference.eval_mode():
                return self._log_probs(self.reference, data, "ref")
        from peft import PeftModel

        peft_model = next(m for m in self.actor.module.modules() if isinstance(m, PeftModel))
        with self.actor.eval_mode(), peft_model.disable_adapter():
            return self._log_probs(self.actor, data, "ref")

    def loss_fn(self, module, micro: dict):
        """The policy loss of one micro-batch (``FSDPEngine.forward_backward_batch``'s ``step_fn``)."""
        settings, device, roll = self.loss, self.backend.device(), self.config.rollout
        # This rank's slice with sequence parallelism (else the whole micro-batch): its own loss tokens ``mask``,
        # the whole micro-batch's ``counts`` for every normaliser, so the group's results add up (``groups.py``).
        share = MicroBatchShare.of(micro, self.actor.sequence_parallel, device)
        layout, mask, counts = share.layout, share.mask, share.counts
        bonus = settings.entropy_coeff > 0  # the entropy then needs its gradient (else it is a metric only)
        log_probs, entropy = sequence_log_probs(module, layout, roll.temperature, with_entropy=True,
                                                entropy_grad=bonus, top_k=roll.top_k, top_p=roll.top_p)
        old = log_probs.detach() if micro["old_log_probs"] is None else micro["old_log_probs"].to(device)
        agg, norm = settings.agg, settings.norm_length
        advantages = micro["advantages"].to(device)
        if micro["sampling_log_probs"] is not None:  # the engine's own: measure the mismatch, correct for it
            algo = self.config.algorithm
            sampled = micro["sampling_log_probs"].to(device)
            weights, ratios, masked = importance_weights(old, sampled, mask, algo.rollout_correction,
                                                         algo.rollout_correction_cap, share.across)
            if self._mismatch is not None:  # the first PPO epoch of an update()
                self._mismatch.add(old, sampled, mask, ratios, masked, share.counted_sequences())
            advantages = advantages.unsqueeze(-1) * weights  # weights each token's policy-gradient term
        loss, metrics = policy_loss(log_probs, old, advantages, mask,
                                    loss_mode=settings.loss_mode, clip_low=settings.clip_low,
                                    clip_high=settings.clip_high, clip_c=settings.clip_c, agg=agg, norm_length=norm,
                                    counts=counts, across=share.across)
        # Normalisers over the whole mini-batch: every micro-batch of every group; a filler counts for nothing.
        scale, weight = micro_batch_scale(counts, agg, micro["micro_batches"])
        if layout.filler:
            weight = weight * 0.0
        metrics = {"pg_loss": loss.item() * scale, "clip_frac": metrics["clip_frac"],
                   "approx_kl": metrics["approx_kl"],
                   "entropy": aggregate_loss(entropy.detach(), mask, "token-mean", counts=counts).item()}
        if micro["ref_log_probs"] is not None:
            kl = aggregate_loss(kl_penalty(log_probs, micro["ref_log_probs"].to(device), settings.kl_kind), mask, agg,
                                norm, counts)
            loss = loss + settings.kl_loss_coef * kl
            metrics["kl"] = kl.item() * scale
        if bonus:
            loss = loss - settings.entropy_coeff * aggregate_loss(entropy, mask, agg, norm, counts)
        return loss * scale, weight, metrics

    def update(self, data: StepData, loss_fn=None) -> dict:
        """The PPO updates of a step; the averaged metrics, with ``mismatch``: the rollout engine's log-probs
        against the policy's over the first epoch (``MismatchStats``). ``loss_fn`` replaces ``self.loss_fn`` (a
        benchmark measuring it)."""
        with phase("update"):
            return self._update(data, loss_fn or self.loss_fn)

    def _update(self, data: StepData, loss_fn) -> dict:
        train = self.config.train
        totals: dict[str, float] = {}
        updates, peak_gib = 0, 0.0
        mismatch = MismatchStats()
        with self.actor.train_mode():
            for epoch in range(train.ppo_epochs):
                self._mismatch = mismatch if epoch == 0 else None  # the rollout's log-probs are compared once a step
                for mini in data.mini_batches:
                    metrics = self.actor.forward_backward_batch(data.micro_batches(mini), loss_fn)
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
        self._mismatch = None
        return {**averaged, "mismatch": mismatch}

    def _global(self, stats: dict) -> dict:
        return sum_over_ranks(stats, self.backend.metrics_device())

    def pad_counts(self, data: StepData) -> dict:
        """This rank's pad tokens computed in each pass over the step's data (update, ref, old); a
        sequence-parallel group's ranks share each micro-batch, so each counts its share."""
        size = self.groups.sp.size
        return {f"pad_tokens_{what}": data.pad_tokens.get(what, 0) / size for what in ("update", "ref", "old")}

    def packing_metrics(self, data: StepData) -> dict:
        """The path that ran, micro-batches per update, token imbalance, and the pad tokens summed over ranks (a
        collective: every rank calls it); a step reports the same figures through the loop's one reduction."""
        return {**data.plan_metrics(), **self._global(self.pad_counts(data))}

    def _batch_std(self, rewards: torch.Tensor) -> float:
        """The (unbiased) std of the rewards of the step's whole batch, all ranks together (``rewards``: the ones this
        rank hands to the batch)."""
        t = self._global({"n": float(len(rewards)), "sum": rewards.sum().item(),
                          "sq": (rewards.double() ** 2).sum().item()})
        return math.sqrt(max(t["sq"] - t["sum"] ** 2 / t["n"], 0.0) / max(t["n"] - 1.0, 1.0))

    def validate(self, step: int, baseline: bool = False) -> dict:
        """Validation after ``step`` (0-based) when due; ``baseline``: before the first step, when asked for."""
        cfg = self.config
        every, last_step = cfg.run.val_every, step + 1 == cfg.train.steps
        if baseline and cfg.run.val_before_train is False:
            return {}
        if not self.val_samples or not (baseline or last_step or (every and (step + 1) % every == 0)):
            return {}
        if self.ahead is not None:  # the tokenizer is the sampler thread's too: one at a time
            with self.ahead.tokenizer_lock:
                return self._validate()
        return self._validate()

    def _validate(self) -> dict:
        return validate(self.actor, self.rollout_engine, self.sampler, self.val_samples, self.rewards,
                        self.val_sampling, batch_prompts=max(1, self.config.train.prompts_per_step // self.world_size))

    def ready(self, start: int) -> None:
        """After the loop resumed from step ``start``: an engine holding its own copy takes the loaded weights; with
        ``rollout.max_staleness`` > 0 the sampler thread starts from them."""
        if start:
            sync_weights(self.actor, self.rollout_engine)
        if self.ahead is not None:
            self.ahead.start(start, self.config.train.steps)
        self.borrowing = self._borrow_server_cores()

    def _borrow_server_cores(self) -> BorrowedThreads | None:
        """``rollout.vllm.borrow_threads`` (servers on this host's cores): this thread's compute takes more threads
        while no request is in flight (synchronously: whenever it computes); the server engine's plan says how."""
        ahead = self.ahead
        return borrow_idle_cores(self.rollout_engine, lambda: ahead is not None and ahead.sampling())

    def close(self) -> None:
        """The run ended (done, stopped or failed): the sampler thread stops, borrowed threads go back."""
        if self.ahead is not None:
            self.ahead.close()
        if self.borrowing is not None:
            self.borrowing.stop()

    def step(self, step: int) -> StepResult:
        """One GRPO step; its figures for the loop to reduce over ranks (``StepResult``)."""
        started = time.perf_counter()
        self.backend.reset_peak_memory_stats()
        if self.ahead is not None:  # sampled ahead by the thread, checked against the bound
            sampled, dropped, staleness, stalest, waited = self.ahead.take(step)
            data, stats, extras = self.collect(step, sampled, dropped)
        else:
            data, stats, extras = self.collect(step)
            staleness, stalest = synchronous_figures(int(stats["sequences"]))
            waited = extras["sampling_s"]  # the trainer waits for the whole sampling
        rollout_peak_gib = (self.backend.memory_stats().peak_allocated or 0) / 2**30
        rollout_done = time.perf_counter()
        self.rollout_engine.release_memory()  # an engine sharing the device gives it to the update
        update = self.update(data)
        synced = time.perf_counter()
        sync_weights(self.actor, self.rollout_engine)  # an engine holding its own copy takes the new weights
        finished = time.perf_counter()
        if self.ahead is not None:
            waited += self.ahead.pushed(step + 1)
        busy = self.ahead.busy_seconds(started, finished) if self.ahead is not None else extras["sampling_s"]
        mismatch = update.pop("mismatch")
        sums = {**stats, **self.pad_counts(data), **mismatch.sums(), **self.groups.once(staleness),
                "sampler_busy_frac": busy / max(finished - started, 1e-9)}
        maxima = {"response_length_max": extras["longest"], **stalest, "trainer_wait_s": waited,
                  "peak_memory_gib": max(rollout_peak_gib, update["peak_memory_gib"]), **mismatch.maxima()}
        times = {"rollout": rollout_done - started, "update": finished - rollout_done, "step": finished - started,
                 "weight_sync": finished - synced}
        plan_metrics = data.plan_metrics()

        def metrics(totals: dict, largest: dict) -> dict:
            return step_row(totals, largest, update, times, plan_metrics, MismatchStats.reduced(totals, largest),
                            self.reward_names, self.groups.size, self.world_size)

        return StepResult(metrics=metrics, sums=sums, maxima=maxima, samples=extras["samples"], shown=shown)

    def train(self) -> dict:
        """The frame's loop over this trainer (``engine/train/loop.py``), as ``accel-grpo`` runs it."""
        from ...train.loop import run_parts
        from ...train.registry import get_recipe

        recipe = get_recipe("grpo")
        return run_parts(recipe, recipe.plan_of(self.config, self.world_size), self, self.run_dir, self.resume)

