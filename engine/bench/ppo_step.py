"""A PPO step against a GRPO step of the same work: the registered ``ppo`` and ``grpo`` recipes' real steps on the
CPU demo's model and task with the same prompts, responses per prompt, response length and micro-batches (no KL
reference on either side, the critic trained from the first step), interleaved step by step so that both see the
same machine load. PPO's extra work is the critic: its value forward over the step's batch and its own update."""

from __future__ import annotations

import time

from .common import ratio, summary

WORK = ["train.prompts_per_step=16", "rollout.n=4", "rollout.max_new_tokens=4", "train.micro_batch_size=16",
        "run.progress=false"]
SIDES = {"grpo": ["algorithm.kl_loss_coef=0.0"], "ppo": ["critic.warmup_steps=0"]}


def _parts(name: str, backend, world_size: int):
    from ..train.cli import load
    from ..train.registry import get_recipe

    recipe = get_recipe(name)
    config, _, _ = load(recipe, "cpu-demo", None, [*WORK, *SIDES[name]])
    problems = recipe.check(config, world_size)
    if problems:
        raise ValueError(f"the {name} side's settings are invalid: " + "; ".join(problems))
    parts = recipe.build(recipe.plan(config, world_size, verbose=False), backend)
    recipe.ready(parts, 0)
    return recipe, parts


def run(options, backend, rank) -> dict:
    import torch.distributed as dist

    world_size = dist.get_world_size()
    sides = {name: _parts(name, backend, world_size) for name in SIDES}
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    for step in range(options["grpo_steps"] + 1):  # the first step of each warms up and is not counted
        for name, (recipe, parts) in sides.items():
            start = time.perf_counter()
            recipe.step(parts, step)
            backend.synchronize()
            if step:
                times[name].append(time.perf_counter() - start)
    return {"work": WORK, "sides": SIDES, "world_size": world_size,
            "step": {name: summary(values) for name, values in times.items()},
            "ppo_over_grpo": ratio(times["ppo"], times["grpo"])}
