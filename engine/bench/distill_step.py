"""On-policy distillation's step against a GRPO step on the same student, prompts and geometry, interleaved
(distill, GRPO, distill, GRPO...): seconds per response token of each, their ratio per round (median over rounds),
and each step's parts from the phases it enters (rollout, the teacher's forward, the reference's, the update).
GRPO runs without a KL reference (``algorithm.kl_loss_coef=0``), so the teacher's forward is what distillation
adds. The teacher is the built-in character model at ``--distill-teacher-hidden`` x ``--distill-teacher-layers``
(random weights: timing only), written by the launcher; the student is the cpu-demo preset's unless
``--distill-override model.path=...``."""

from __future__ import annotations

import time

from .common import ratio, summary

PARTS = ("rollout", "teacher_log_probs", "ref_log_probs", "update")
WORK = ["run.progress=false", "rollout.n=8", "train.prompts_per_step=16", "rollout.max_new_tokens=32",
        "rollout.engine=hf-continuous"]


def run(options, backend, rank) -> dict:
    import torch.distributed as dist

    from ..runtime import phase_timings
    from ..train.cli import load
    from ..train.registry import get_recipe

    world_size, sides = dist.get_world_size(), {}
    teacher = options["distill_teacher_dir"]
    for name, own in (("distill", [f"teacher.path={teacher}"]), ("grpo", ["algorithm.kl_loss_coef=0"])):
        recipe = get_recipe(name)
        config, _, _ = load(recipe, "cpu-demo", None, [*WORK, *own, *options["distill_overrides"]])
        problems = recipe.check(config, world_size)
        if problems:
            raise ValueError(f"the distill benchmark's {name} settings are invalid: " + "; ".join(problems))
        parts = recipe.build(recipe.plan(config, world_size, verbose=False), backend)
        recipe.ready(parts, 0)
        sides[name] = (recipe, parts)
    per_token = {name: [] for name in sides}
    parts_s = {name: {part: [] for part in PARTS} for name in sides}
    tokens = {name: [] for name in sides}
    with phase_timings(backend.synchronize) as timer:
        for step in range(options["distill_steps"] + 1):  # the first round warms up and is not counted
            for name, (recipe, parts) in sides.items():
                timer.reset()
                start = time.perf_counter()
                result = recipe.step(parts, step)
                backend.synchronize()
                seconds = time.perf_counter() - start
                if step == 0:
                    continue
                produced = result.sums["response_tokens"]
                per_token[name].append(seconds / max(produced, 1.0))
                tokens[name].append(produced)
                for part in PARTS:
                    parts_s[name][part].append(timer.seconds.get(part, 0.0))
    for recipe, parts in sides.values():
        recipe.close(parts)
    return {"world_size": world_size, "overrides": [*WORK, *options["distill_overrides"]], "teacher": teacher,
            "ms_per_response_token": {name: summary(values) for name, values in per_token.items()},
            "response_tokens_per_step_per_rank": {name: sorted(v)[len(v) // 2] for name, v in tokens.items()},
            "parts": {name: {part: summary(v) for part, v in by_part.items()} for name, by_part in parts_s.items()},
            "distill_over_grpo_per_token": ratio(per_token["distill"], per_token["grpo"])}
