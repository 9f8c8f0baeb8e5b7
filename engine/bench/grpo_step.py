"""GRPO step breakdown for a preset (``cpu-demo`` by default): rollout, old and reference log-probs, update.

Runs the registered ``grpo`` recipe's real step (``Recipe.step``, as the frame's loop does) and times its parts
through the phases the step enters (``engine.runtime.phase_timings``), so the figures follow the trainer as it
changes: a trainer that skips the old-log-prob forward shows zero calls there. Beside each part: its MFU (the
step's own ``perf/mfu/<phase>``, median over the timed steps; none where the backend knows no peak). ``--profile``
adds a ``torch.profiler`` table of one step.
"""

from __future__ import annotations

import time

from .common import summary

PARTS = ("rollout", "old_log_probs", "ref_log_probs", "update")
FSDP_HOOK_FRAMES = {"FSDP::pre_forward", "FSDP::post_forward", "FSDP::pre_backward", "FSDP::post_backward",
                    "FSDP::root_post_backward"}


def _profile(recipe, parts, step: int, rows: int) -> dict:
    """The ops taking most of one step's CPU time (self time), from ``torch.profiler``, and FSDP's share."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        recipe.step(parts, step)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    # FSDP's hooks, inclusive of the gathers, copies and reshards they run (these frames do not nest).
    hooks = sum(e.cpu_time_total for e in events if e.key.split(" ")[0] in FSDP_HOOK_FRAMES)
    table = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return {"self_cpu_ms": total / 1e3, "fsdp_hooks_cpu_ms": hooks / 1e3, "fsdp_share": hooks / max(total, 1),
            "top_ops": [{"name": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                         "cpu_total_ms": e.cpu_time_total / 1e3} for e in table]}


def run(options, backend, rank) -> dict:
    import torch.distributed as dist

    from ..runtime import phase_timings
    from ..train.cli import load
    from ..train.registry import get_recipe

    recipe = get_recipe("grpo")
    overrides = ["run.progress=false", *options["grpo_overrides"]]
    config, _, _ = load(recipe, options["grpo_preset"], None, overrides)  # accel-bench printed its notices
    problems = recipe.check(config, dist.get_world_size())
    if problems:
        raise ValueError("the GRPO benchmark's settings are invalid: " + "; ".join(problems))
    parts = recipe.build(recipe.plan(config, dist.get_world_size(), verbose=False), backend)
    recipe.ready(parts, 0)
    times = {name: [] for name in PARTS}
    steps, tokens, calls, perf = [], [], {}, {}
    with phase_timings(backend.synchronize) as timer:
        for step in range(options["grpo_steps"] + 1):  # the first step warms up and is not counted
            timer.reset()
            start = time.perf_counter()
            result = recipe.step(parts, step)
            backend.synchronize()
            end = time.perf_counter()
            if step == 0:
                continue
            steps.append(end - start)
            row = result.metrics(result.sums, result.maxima)  # this rank's figures: its perf/* are the step's
            for key, value in row.items():
                if key.startswith("perf/"):
                    perf.setdefault(key, []).append(value)
            tokens.append(result.sums["response_tokens"])
            for name in PARTS:
                times[name].append(timer.seconds.get(name, 0.0))
            calls = {name: timer.calls.get(name, 0) for name in PARTS}
    result = {"preset": options["grpo_preset"], "overrides": overrides, "world_size": dist.get_world_size(),
              "sequences_per_rank": int(result.sums["sequences"]), "step": summary(steps),
              "parts": {name: summary(values) for name, values in times.items()}, "calls_per_step": calls}
    other = [s - sum(times[name][i] for name in PARTS) for i, s in enumerate(steps)]
    result["parts"]["other"] = summary(other)
    result["perf"] = {key: sorted(values)[len(values) // 2] for key, values in perf.items()}  # medians
    median_s = result["step"]["median_ms"] / 1e3
    result["response_tokens_per_step_per_rank"] = sorted(tokens)[len(tokens) // 2]
    result["response_tokens_per_s_per_rank"] = result["response_tokens_per_step_per_rank"] / median_s
    result["share_of_step"] = {name: row["median_ms"] / result["step"]["median_ms"]
                               for name, row in result["parts"].items()}
    if options["profile"]:
        result["profile"] = _profile(recipe, parts, options["grpo_steps"] + 1, rows=20)
    return result
