"""An RL step's metrics row (``metrics.jsonl``), from its figures summed and maxed over ranks by the loop.

The rollout-timing figures are reported in every mode, so curves compare across synchronous and asynchronous runs:
``rollout/staleness_mean`` / ``_max`` (weight versions between a sample's oldest token and the policy trained on
it; 0 when synchronous), ``rollout/dropped_stale`` (samples too stale to train on), ``rollout/weight_sync_s`` (the
push after the update; ~0 for engines that decode with the policy's own parameters), ``rollout/weight_sync_bytes``
(the bytes that push sent to one engine copy: the whole model, or with ``rollout.vllm.lora_sync=adapter`` the LoRA
adapter alone; with ``rollout.vllm.weight_sync=delta`` only the changed elements' indices and values, and then
``rollout/weight_sync_changed_frac``, the share of the model's elements whose bits changed; 0 for engines that decode
with the policy's own parameters), ``time/trainer_wait_s`` (the
trainer waiting for samples, the rank that waited longest: the whole sampling when synchronous; the wait for the
thread's batch and, in pause mode ``wait``, for requests in flight to finish before a push) and
``rollout/sampler_busy_frac`` (the share of the step's wall time its sampling ran, mean over ranks).

``perf/mfu`` (the update's model FLOPs utilisation, the headline), ``perf/mfu/<phase>`` and ``perf/tflops/<phase>``
for the phases the step times (``rollout``, ``update``, ``old_log_probs``, ``ref_log_probs``,
``teacher_log_probs``): the FLOPs of ``phase_flops`` (``engine/runtime/flops.py``) over rank 0's seconds in the phase
x the ranks x the backend's ``peak_flops`` (no ``perf/mfu*`` where the backend knows no peak).

``frozen/<name>_s``: each frozen model's forward over the step's batch (``ref``, ``teacher``), timed to its end on
the device, the rank that took longest.
"""

from __future__ import annotations

import math

from ..rollout import trajectories
from ..runtime import FORWARD_BACKWARD, Geometry, OneLineError
from . import scoring


def phase_flops(policy: Geometry | None, frozen: dict[str, Geometry | None], lengths: list[int], epochs: int,
                old_pass: bool) -> dict[str, float]:
    """The FLOPs of each phase of a step over the whole step's sequences (every rank's, prompt + response):
    rollout (a forward's worth: decoding with a KV cache computes each token once; draws a dynamic sampler
    discarded are not counted), the updates (forward + backward, ``epochs`` times), the old log-probs' forward when
    ``old_pass``, and a ``<name>_log_probs`` forward per frozen model on the trainer's devices (``frozen``: their
    geometry). A model without a known geometry gets no entry."""
    flops = {}
    if policy is not None:
        forward = policy.forward_flops(lengths)
        flops.update(rollout=forward, update=FORWARD_BACKWARD * epochs * forward)
        if old_pass:
            flops["old_log_probs"] = forward
    for name, geometry in frozen.items():
        if geometry is not None:
            flops[f"{name}_log_probs"] = geometry.forward_flops(lengths)
    return flops


def step_row(totals: dict, largest: dict, update: dict, times: dict, plan_metrics: dict, mismatch: dict,
             reward_names: list[str], world_size: int, algorithm_metrics: dict, perf: dict | None = None) -> dict:
    """The step's metrics row; ``world_size``: the ranks (each reports its sampler's busy fraction);
    ``algorithm_metrics``: the algorithm's own figures (GRPO's ``sampling/*`` with dynamic sampling); ``perf``: the
    ``perf/*`` figures (``flops.perf_metrics``)."""
    count = totals["sequences"]
    mean = totals["reward_sum"] / count
    row = {
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
        "response_length_max": largest["response_length_max"],
        "response_clip_frac": totals["clipped"] / count,
        "rollout_tokens_computed": totals["rollout_tokens_computed"],
        "rollout_tokens_produced": totals["response_tokens"] - totals["stale_tokens"],  # the tokens trained
        "tokens_per_s": totals["response_tokens"] / times["step"],
        "rollout_time_s": times["rollout"],
        "update_time_s": times["update"],
        "step_time_s": times["step"],
        "peak_memory_gib": largest["peak_memory_gib"],
        **{key: largest[key] for key in ("peak_memory_gib/rollout", "peak_memory_gib/update") if key in largest},
    }
    row.update(scoring.reward_metrics(totals, reward_names))  # reward/<name>, overlong_penalty
    row.update(algorithm_metrics)  # e.g. sampling/*, with filter_groups
    row.update({key: value for key, value in update.items() if "/" in key})  # a term's own, e.g. distill/*
    row.update(trajectories.metrics(totals))  # tools/*, rollout/turns_mean, rollout/tool_tokens, with tools
    row.update(plan_metrics)  # packed, micro_batches, token_imbalance
    row.update({key: totals[key] for key in ("pad_tokens_old", "pad_tokens_ref", "pad_tokens_update")})
    row.update({
        "rollout/staleness_mean": totals["staleness_sum"] / max(totals["staleness_rows"], 1.0),
        "rollout/staleness_max": largest["staleness_max"],
        "rollout/dropped_stale": totals["dropped_stale"],
        "rollout/weight_sync_s": times["weight_sync"],
        "rollout/weight_sync_bytes": largest["weight_sync_bytes"],
        **({"rollout/weight_sync_changed_frac": largest["weight_sync_changed_frac"]}
           if "weight_sync_changed_frac" in largest else {}),
        "time/trainer_wait_s": largest["trainer_wait_s"],
        "rollout/sampler_busy_frac": totals["sampler_busy_frac"] / world_size,
    })
    row.update(mismatch)  # rollout/logprob_diff_*, rollout/is_*
    row.update(perf or {})  # perf/mfu, perf/mfu/<phase>, perf/tflops/<phase>
    return row


def weight_sync_figures(engine) -> dict[str, float]:
    """The share of changed elements of the engine's last push, where it measures one (weight_sync=delta)."""
    stats = getattr(engine, "push_stats", None)
    return {} if stats is None else {"weight_sync_changed_frac": stats.changed_frac}


def frozen_seconds(largest: dict, frozen, aliases: dict[str, str]) -> dict[str, float]:
    """``frozen/<name>_s`` of every frozen model (``largest``: the step's maxima over ranks), each also under the
    name ``aliases`` gives it (``Algorithm.metric_aliases``: a name the algorithm reported it by before)."""
    row = {f"frozen/{name}_s": largest[f"frozen_{name}_s"] for name in frozen}
    return {**row, **{aliases[key]: value for key, value in row.items() if key in aliases}}


def require_finite(row: dict, step: int) -> None:
    """Stop the run (one line, exit status != 0, no checkpoint of it) when the step's reward or any loss is not a
    finite number: training on it would only spread nan through the weights, and a run must never end "done" so.
    The row is the same on every rank (its figures were reduced over ranks), so every rank stops here together."""
    bad = [key for key, value in row.items() if (key in ("reward_mean", "reward_std") or key.endswith("loss"))
           and isinstance(value, float) and not math.isfinite(value)]
    if bad:
        raise OneLineError(
            f"step {step + 1}: {', '.join(f'{key} is {row[key]}' for key in bad)}: not a finite number, so the run "
            "stops rather than train on it (rewards too large to sum in float32, whose range ends near 3.4e38, or "
            "a diverged update: check the reward functions and reward model, or lower engine.lr)")


def shown(row: dict) -> dict:
    """The progress bar's figures."""
    figures = {"reward": f"{row['reward_mean']:.3f}", "step_s": f"{row['step_time_s']:.2f}"}
    if "val/accuracy" in row:
        figures["val_acc"] = f"{row['val/accuracy']:.3f}"
    return figures
