"""GRPO step breakdown for a preset (``cpu-demo`` by default): rollout, old and reference log-probs, update.

Runs the real ``GRPOTrainer`` step by step and times its parts by wrapping the functions the trainer calls
(its sampler and ``planned_log_probs``), so the figures follow the trainer as it changes: a trainer that skips the
old-log-prob forward shows zero calls there. ``--profile`` adds a ``torch.profiler`` table of one step.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from .common import summary

PARTS = ("rollout", "old_log_probs", "ref_log_probs", "update")
FSDP_HOOK_FRAMES = {"FSDP::pre_forward", "FSDP::post_forward", "FSDP::pre_backward", "FSDP::post_backward",
                    "FSDP::root_post_backward"}


class _PartTimer:
    """Wraps the trainer's sampler (or its module's ``rollout``) and ``planned_log_probs`` to time and count them
    per step."""

    def __init__(self, trainer_module, trainer) -> None:
        self.module, self.trainer = trainer_module, trainer
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.calls = dict.fromkeys(PARTS, 0)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.calls = dict.fromkeys(PARTS, 0)

    def _wrap(self, original, name_of):
        def timed(*args, **kwargs):
            name = name_of(*args)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.trainer.backend.synchronize()
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1

        return timed

    def __enter__(self):
        namers = {"rollout": lambda *a: "rollout",
                  "planned_log_probs": lambda engine, data, temperature, what: f"{what}_log_probs"}
        # A trainer that no longer calls one of these shows its time under "other" rather than failing here.
        self._saved = {name: getattr(self.module, name) for name in namers if hasattr(self.module, name)}
        for name, original in self._saved.items():
            setattr(self.module, name, self._wrap(original, namers[name]))
        self._sampler = getattr(self.trainer, "sampler", None)  # the trainer's one sampler, single- or multi-turn
        if self._sampler is not None:
            self.trainer.sampler = self._wrap(self._sampler, namers["rollout"])
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(self.module, name, original)
        if self._sampler is not None:
            self.trainer.sampler = self._sampler


def _profile(trainer, step: int, rows: int) -> dict:
    """The ops taking most of one step's CPU time (self time), from ``torch.profiler``, and FSDP's share."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        data, _ = trainer.collect(step)
        trainer.update(data)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    # FSDP's hooks, inclusive of the gathers, copies and reshards they run (these frames do not nest).
    hooks = sum(e.cpu_time_total for e in events if e.key.split(" ")[0] in FSDP_HOOK_FRAMES)
    table = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return {"self_cpu_ms": total / 1e3, "fsdp_hooks_cpu_ms": hooks / 1e3, "fsdp_share": hooks / max(total, 1),
            "top_ops": [{"name": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                         "cpu_total_ms": e.cpu_time_total / 1e3} for e in table]}


def run(options, backend, rank) -> dict:
    from ..grpo import trainer as trainer_module
    from ..grpo.config import check, load_config
    from ..rollout.single_turn import sync_weights

    overrides = ["run.progress=false", *options["grpo_overrides"]]
    config, _ = load_config(options["grpo_preset"], None, overrides)  # accel-bench printed its notices
    with tempfile.TemporaryDirectory() as run_dir:
        import torch.distributed as dist

        problems = check(config, dist.get_world_size())
        if problems:
            raise ValueError("the GRPO benchmark's settings are invalid: " + "; ".join(problems))
        trainer = trainer_module.GRPOTrainer(config, Path(run_dir), resume=False)
        parts = {name: [] for name in PARTS}
        steps, tokens, calls = [], [], {}
        with _PartTimer(trainer_module, trainer) as timer:
            for step in range(options["grpo_steps"] + 1):  # the first step warms up and is not counted
                timer.reset()
                start = time.perf_counter()
                data, stats = trainer.collect(step)
                trainer.rollout_engine.release_memory()  # as the trainer does (an engine sharing the device)
                update_start = time.perf_counter()
                trainer.update(data)
                backend.synchronize()
                update_end = time.perf_counter()
                sync_weights(trainer.actor, trainer.rollout_engine)  # engines with their own copy: in "other"
                end = time.perf_counter()
                timer.seconds["update"], timer.calls["update"] = update_end - update_start, 1
                if step == 0:
                    continue
                steps.append(end - start)
                tokens.append(stats["response_tokens"])
                for name in PARTS:
                    parts[name].append(timer.seconds[name])
                calls = dict(timer.calls)
        result = {"preset": options["grpo_preset"], "overrides": overrides, "world_size": trainer.world_size,
                  "sequences_per_rank": int(stats["sequences"]), "step": summary(steps),
                  "parts": {name: summary(values) for name, values in parts.items()},
                  "calls_per_step": calls}
        other = [s - sum(parts[name][i] for name in PARTS) for i, s in enumerate(steps)]
        result["parts"]["other"] = summary(other)
        median_s = result["step"]["median_ms"] / 1e3
        result["response_tokens_per_s_per_rank"] = sorted(tokens)[len(tokens) // 2] / median_s
        result["share_of_step"] = {name: row["median_ms"] / result["step"]["median_ms"]
                                   for name, row in result["parts"].items()}
        if options["profile"]:
            result["profile"] = _profile(trainer, options["grpo_steps"] + 1, rows=20)
    return result
