"""The RL step every RL recipe runs, blind to its algorithm (``algorithm.py``), on every rank inside the frame's loop
(``engine/train/loop.py``): prompts -> rollout -> rewards -> per-sequence advantages -> the step's global batch ->
old and frozen models' log-probs -> per-token advantages -> updates with the algorithm's loss terms; each step
returns its figures (``StepResult``) for the loop to reduce over ranks, log and checkpoint.

Each rank samples its own prompts and all ``n`` responses of each, so whole groups stay on one rank and group
advantages need no communication (with sequence parallelism: each group of ranks, ``groups.py``). Then every rank
receives the whole step's batch once (``batches.py``): mini-batches are global, and each is planned into
micro-batches (packed, within a token budget, ranks balanced by tokens) that the log-prob passes and the update
share. Updates go through ``FSDPEngine.forward_backward_batch`` (deferred gradient sync) and ``optimizer_step``
(``update.py``); metrics are averaged over ranks through the backend.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch

import accel_backends

from .. import FSDPEngine
from ..rollout import sync_weights
from ..rollout.staleness import synchronous_figures
from ..runtime import Geometry, perf_metrics, phase, phase_timings, sum_over_ranks
from ..train.config import dist_timeout_s
from ..train.recipe import StepResult
from ..train.validation import should_validate
from . import scoring
from .ahead import AheadSampling
from .algorithm import Algorithm, StepContext
from .batches import StepData, batching_for, gather_step_data, rank_sequences
from .engine_settings import engine_config
from .groups import SamplingGroups
from .logprobs import planned_log_probs
from .parts import borrow_server_cores, frozen_models, load_inputs, rollout_parts, run_rewards
from .reward_model import stop_on_failures
from .rewards import metric_names
from .rollout_correction import MismatchStats
from .sizes import prompts_per_rank, updates_per_step
from .step_metrics import frozen_seconds, phase_flops, require_finite, shown, step_row, weight_sync_figures
from .trained import trained_models
from .update import Correction, idle_update, policy_loss_of, ppo_updates
from .validation import validate


class RLTrainer:
    """An RL run's parts on one rank: the policy (``actor``), the frozen models and the models the algorithm trains
    beside it, the rollout engine, data and rewards; ``algorithm`` decides advantages, the loss and its own models'
    updates. ``recipe``: the registered recipe whose loop ``train()`` runs; ``tool``: how notices name the
    command."""

    def __init__(self, config, algorithm: Algorithm, run_dir: Path | None = None, resume: bool = False,
                 inputs=None, *, recipe: str = "rl", tool: str = "accel-rl") -> None:
        self.config, self.algorithm, self.recipe, self.tool = config, algorithm, recipe, tool
        self.run_dir, self.resume = run_dir, resume  # for train() only
        self.backend = accel_backends.get_backend()
        world_size = self.backend.init_distributed(timeout=dist_timeout_s(config)).world_size
        self.tokenizer, factory, (self.task, self.val_samples), file_rewards = inputs or load_inputs(config)
        self.rewards = run_rewards(config, file_rewards)
        self.reward_names = metric_names(self.rewards)
        self.actor = FSDPEngine(factory, engine_config(config, world_size), self.backend)
        self.frozen = frozen_models(algorithm.frozen_models(world_size), factory, self.actor, self.backend)
        self.rank, self.world_size = self.actor.rank, self.actor.world_size
        self.prompts_per_rank = prompts_per_rank(config, world_size)  # each sequence-parallel group's, on its ranks
        self.groups = SamplingGroups(self.actor.sequence_parallel, self.backend.metrics_device())
        # One optimizer update per step: at update time the policy IS the rollout policy, so its own log-probs,
        # detached, are the old ones (the ratio is exactly 1) and the separate old-log-prob forward is skipped.
        self.reuse_policy_log_probs = updates_per_step(config, world_size) == 1 and not algorithm.needs_old_log_probs
        # Packed micro-batches when asked for and the model's attention keeps packed sequences apart (a probe).
        self.packed = config.train.padding_free and self.actor.packed_input_supported()
        self.batching = batching_for(config, world_size, self.packed)
        if self.rank == 0:
            for notice in algorithm.notices(world_size):
                print(f"{self.tool}: note: {notice}", file=sys.stderr, flush=True)
        rollout = rollout_parts(config, self.actor, self.tokenizer, factory, self.backend, self.prompts_per_rank)
        self.sampling, self.val_sampling = rollout.sampling, rollout.val_sampling
        self.rollout_engine, self.sampler = rollout.engine, rollout.sampler
        sync_weights(self.actor, self.rollout_engine)  # an engine holding its own copy starts from the policy
        self.trained: dict[str, FSDPEngine] = {}  # built last (below), seen by the algorithm through the context
        self.context = StepContext(self.groups, self._global, tuple(reward.weight for reward in self.rewards),
                                   self.tokenizer.pad_token_id, self.trained, self.backend.device())
        self.terms, self.correction = algorithm.terms(), Correction.of(config.algorithm)  # once per run
        # rollout.max_staleness > 0: a thread samples the next steps' batches while this one trains (ready())
        bound = config.rollout.max_staleness
        self.ahead = AheadSampling(self, bound) if bound > 0 else None
        self.borrowing = None  # rollout.vllm.borrow_threads, from ready() on
        # MFU's parts, found once: the models' shapes, one device's peak in the compute dtype (the CPU measures it)
        self.geometry = Geometry.of(self.actor.model_config)
        self.frozen_geometry = {name: self._frozen_geometry(model) for name, model in self.frozen.items()}
        self.peak_flops = self.backend.peak_flops(self.actor.compute_dtype)
        self.trained.update(trained_models(algorithm.trained_models(world_size), factory, self.backend))

    @property
    def engine(self) -> FSDPEngine:
        """The policy's engine (the one export writes)."""
        return self.actor

    @property
    def engines(self) -> dict[str, FSDPEngine]:
        """Every trained engine, the policy first: the frame checkpoints and resumes them as one."""
        return {"policy": self.actor, **self.trained}

    @property
    def reference(self) -> FSDPEngine | None:
        """The KL reference's own engine (None without a reference, or with LoRA: the policy's base model)."""
        ref = self.frozen.get("ref")
        return None if ref is None else ref.engine

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
        cfg, roll, algorithm = self.config, self.config.rollout, self.algorithm
        generator = self._seed(step)
        sampling_s = [0.0]
        buffer_len, factor = algorithm.overlong

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
                return scoring.score_rollout(self.rewards, samples, batch, roll.n, roll.max_new_tokens, buffer_len,
                                             factor)

        with self.actor.eval_mode():
            drawn = algorithm.draw(draw, self.context, cfg.train.prompts_per_step)
        scored, batch = drawn.scored, drawn.scored.batch
        leads = drawn.trains and self.groups.leader  # a group's rows count once
        advantages = algorithm.advantages(scored, self.context, leads)
        drop = torch.zeros(len(batch), dtype=torch.bool) if dropped is None else dropped
        if algorithm.mask_truncated:  # responses cut at max_new_tokens get no loss (their attention is unchanged)
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
        data.step = step
        frozen_s = {}
        for name, model in self.frozen.items():  # each timed to its end on the device: frozen/<name>_s
            began = time.perf_counter()
            with phase(f"{name}_log_probs"):
                data.frozen_log_probs[name] = model.log_probs(data, roll)
                self.backend.synchronize()
            frozen_s[name] = time.perf_counter() - began
        per_token = algorithm.token_advantages(data, self.context)
        if per_token is not None:
            data.advantages = per_token
        overlong = buffer_len > 0
        stats = self.groups.once({**scoring.rollout_sums(drawn.draws, overlong=overlong), **drawn.metrics,
                                  "rollout_tokens_computed": float(sum(p.batch.tokens_computed for p in drawn.draws))})
        extras = {"longest": max(float(part.lengths.max().item()) for part in drawn.draws),
                  "sampling_s": sampling_s[0], "frozen_s": frozen_s,
                  "samples": scoring.sample_records(step + 1, scored, advantages,
                                                    cfg.run.log_samples if leads else 0, self.reward_names)}
        return data, stats, extras

    def _log_probs(self, engine: FSDPEngine, data: StepData, what: str) -> torch.Tensor:
        """Forward-only log-probs of this rank's share of the step, under the sampling distribution."""
        roll = self.config.rollout
        return planned_log_probs(engine, data, roll.temperature, what, top_k=roll.top_k, top_p=roll.top_p)

    def reference_log_probs(self, data: StepData) -> torch.Tensor:
        """Log-probs under the frozen reference (``frozen["ref"]``)."""
        return self.frozen["ref"].log_probs(data, self.config.rollout)

    def loss_fn(self, module, micro):
        """The loss of one micro-batch (``FSDPEngine.forward_backward_batch``'s ``step_fn``): the algorithm's
        terms, built once per run, over the micro-batch's streams (``update.py``)."""
        return policy_loss_of(module, micro, self.terms, self.config.rollout, self.correction,
                              self.actor.sequence_parallel, self.backend.device())

    def reconfigure(self) -> None:
        """The algorithm, its loss terms and the rollout correction built again from ``config`` (a test or a
        benchmark that changed ``algorithm.*`` keys between updates; a run never does)."""
        self.algorithm = type(self.algorithm)(self.config)
        self.terms, self.correction = self.algorithm.terms(), Correction.of(self.config.algorithm)

    def update(self, data: StepData, loss_fn=None) -> dict:
        """The PPO updates of a step (none while the algorithm warms up its own models), then the algorithm's
        ``after_update``; the averaged metrics, with ``mismatch``: the rollout engine's log-probs against the
        policy's over the first epoch (``MismatchStats``). ``loss_fn`` replaces ``self.loss_fn`` (a benchmark
        measuring it)."""
        if self.algorithm.updates_policy(data.step):
            with phase("update"):
                figures = ppo_updates(self.actor, data, loss_fn or self.loss_fn, self.config.train.ppo_epochs)
        else:
            figures = idle_update()
        figures.update(self.algorithm.after_update(data, data.step, self.context))
        return figures

    def _frozen_geometry(self, model) -> Geometry | None:
        """A frozen model's shape when its forward runs on this trainer's devices (a LoRA policy's base: the
        policy's); ``None`` for one served elsewhere (a teacher on a server)."""
        if getattr(model, "adapters_of", None) is not None:
            return self.geometry
        engine = getattr(model, "engine", None)
        return None if engine is None else Geometry.of(engine.model_config)

    def perf(self, data: StepData, seconds: dict[str, float]) -> dict:
        """The step's ``perf/*`` figures (``step_metrics.phase_flops``) from this rank's ``seconds`` per phase."""
        flops = phase_flops(self.geometry, self.frozen_geometry, data.sequences.lengths.tolist(),
                            self.config.train.ppo_epochs, not self.reuse_policy_log_probs)
        return perf_metrics(flops, seconds, self.world_size, self.peak_flops)

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

    def validate(self, step: int, baseline: bool = False) -> dict:
        """Validation after ``step`` (0-based) when due; ``baseline``: before the first step, when asked for."""
        cfg = self.config
        if baseline and cfg.run.val_before_train is False:
            return {}
        if not self.val_samples or not (baseline or should_validate(step, cfg.train.steps, cfg.run.val_every)):
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
        self.borrowing = borrow_server_cores(self.rollout_engine, self.ahead)

    def close(self) -> None:
        """The run ended (done, stopped or failed): the sampler thread stops, borrowed threads go back."""
        if self.ahead is not None:
            self.ahead.close()
        if self.borrowing is not None:
            self.borrowing.stop()

    def step(self, step: int) -> StepResult:
        """One RL step; its figures for the loop to reduce over ranks (``StepResult``)."""
        started = time.perf_counter()
        self.backend.reset_peak_memory_stats()
        # The phases' seconds for MFU: no synchronisation added (each phase ends reading its results on the host);
        # the rollout's from the sampling itself (none when a thread sampled ahead: it overlapped other work).
        with phase_timings() as timer:
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
        perf = self.perf(data, {**timer.seconds, "rollout": extras["sampling_s"]})
        synced = time.perf_counter()
        pushed = sync_weights(self.actor, self.rollout_engine)  # an engine holding its own copy takes the new weights
        finished = time.perf_counter()
        if self.ahead is not None:
            waited += self.ahead.pushed(step + 1)
        busy = self.ahead.busy_seconds(started, finished) if self.ahead is not None else extras["sampling_s"]
        mismatch = update.pop("mismatch")
        sums = {**stats, **self.pad_counts(data), **mismatch.sums(), **self.groups.once(staleness),
                "sampler_busy_frac": busy / max(finished - started, 1e-9)}
        maxima = {"response_length_max": extras["longest"], **stalest, "trainer_wait_s": waited,
                  **{f"frozen_{name}_s": seconds for name, seconds in extras["frozen_s"].items()},
                  "weight_sync_bytes": float(pushed), **weight_sync_figures(self.rollout_engine),
                  "peak_memory_gib": max(rollout_peak_gib, update["peak_memory_gib"]), **mismatch.maxima(),
                  # per phase (each measured from its own reset of the backend's peak): read by ci/gpu-check.sh
                  "peak_memory_gib/rollout": rollout_peak_gib, "peak_memory_gib/update": update["peak_memory_gib"]}
        times = {"rollout": rollout_done - started, "update": finished - rollout_done, "step": finished - started,
                 "weight_sync": finished - synced}
        plan_metrics = data.plan_metrics()

        def metrics(totals: dict, largest: dict) -> dict:  # the same totals on every rank: every rank stops alike
            stop_on_failures(self.rewards, totals, step)  # too many model-served rewards failed
            row = step_row(totals, largest, update, times, plan_metrics, MismatchStats.reduced(totals, largest),
                           self.reward_names, self.world_size, self.algorithm.metrics(totals, self.groups.size),
                           perf)
            row.update(frozen_seconds(largest, self.frozen, self.algorithm.metric_aliases))
            require_finite(row, step)
            return row

        return StepResult(metrics=metrics, sums=sums, maxima=maxima, samples=extras["samples"], shown=shown)

    def train(self) -> dict:
        """The frame's loop over this trainer (``engine/train/loop.py``), as the recipe's command runs it."""
        from ..train.loop import run_parts
        from ..train.registry import get_recipe

        recipe = get_recipe(self.recipe)
        return run_parts(recipe, recipe.plan_of(self.config, self.world_size), self, self.run_dir, self.resume)
