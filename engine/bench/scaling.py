"""``scaling``: the GRPO step on 1 rank against 2 ranks doing the same global work, in one run (issue 49).

The long-response case (``common.LONG_CASE_MODEL`` / ``LONG_CASE_WORK``: hidden 128 x 4 layers, 16 prompts x 8
responses of up to 128 tokens over all ranks, one update a step) runs as a 1-rank job, then a 2-rank job, in turn
for ``--scaling-rounds`` rounds, each rank with ``--scaling-threads`` intra-op threads (``OMP_NUM_THREADS`` handed
to the launcher, which the in-process rank honours too). Each job times a warm-up step, then ``--scaling-steps``
steps: the step and its phases (rollout, reference/old log-probs, update), by wall clock and by CPU seconds (every
thread of the rank), and counts the collectives of a step and the threads of each rank.

The ratio is response tokens per second on 2 ranks over 1 rank, per round, the median over rounds (2.0 is the
ceiling where two processes side by side keep full speed). A phase's speed-up is its 1-rank time over its 2-rank
time (the slower rank's). CPU seconds summed over ranks, against the 1-rank job's, say whether 2 ranks do more
work than one (spinning, oversubscribed cores, duplicated work): a loaded machine distorts them far less than wall
time. A rank whose pool is not the asked size stops the scenario: the comparison would mix thread counts.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from .common import LONG_CASE_MODEL, LONG_CASE_WORK

PHASES = ("rollout", "old_log_probs", "ref_log_probs", "update")


def thread_census() -> dict:
    """This process's threads: torch's intra-op and inter-op pools, the OpenMP/MKL variables, the OS threads."""
    import torch

    try:
        os_threads = len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux
        os_threads = 0
    return {"intra_op": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
            "os_threads": os_threads}


def measure(options: dict) -> list[dict]:
    """One job's rank: the GRPO recipe's real step, timed; every rank's figures (gathered to each rank)."""
    import torch.distributed as dist

    import accel_backends

    from ..runtime import phase_timings
    from ..train.cli import load
    from ..train.registry import get_recipe
    from .collective_counter import CollectiveCounter

    backend = accel_backends.get_backend()
    backend.init_distributed()
    recipe = get_recipe("grpo")
    config, _, _ = load(recipe, options["grpo_preset"], None, ["run.progress=false", *options["scaling_overrides"]])
    world = dist.get_world_size()
    problems = recipe.check(config, world)
    if problems:
        raise ValueError("the scaling benchmark's settings are invalid: " + "; ".join(problems))
    parts = recipe.build(recipe.plan(config, world, verbose=False), backend)
    recipe.ready(parts, 0)
    steps = []
    with phase_timings(backend.synchronize) as timer:
        for step in range(options["scaling_steps"] + 1):  # the first step warms up and is not counted
            timer.reset()
            wall, cpu = time.perf_counter(), time.process_time()
            with CollectiveCounter() as counter:
                result = recipe.step(parts, step)
            backend.synchronize()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if step:
                steps.append({"wall_s": wall, "cpu_s": cpu, "tokens": float(result.sums["response_tokens"]),
                              "phases_s": {p: timer.seconds.get(p, 0.0) for p in PHASES},
                              "phases_cpu_s": {p: timer.cpu_seconds.get(p, 0.0) for p in PHASES},
                              "collectives": dict(counter.counts), "threads": thread_census()})
    mine = {"rank": dist.get_rank(), "steps": steps}
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    return every


def summarize(ranks: list[dict]) -> dict:
    """One job's figures: per timed step the slower rank's wall times, every rank's tokens and CPU seconds summed."""
    count = len(ranks[0]["steps"])
    per_step = []
    for i in range(count):
        rows = [rank["steps"][i] for rank in ranks]
        per_step.append({
            "wall_s": max(r["wall_s"] for r in rows), "cpu_s": sum(r["cpu_s"] for r in rows),
            "tokens": sum(r["tokens"] for r in rows),
            "phases_s": {p: max(r["phases_s"][p] for r in rows) for p in PHASES},
            "phases_cpu_s": {p: sum(r["phases_cpu_s"][p] for r in rows) for p in PHASES}})
    median = statistics.median
    return {
        "ranks": len(ranks),
        "tokens_per_s": median(s["tokens"] / s["wall_s"] for s in per_step),
        "step_s": median(s["wall_s"] for s in per_step),
        "phases_s": {p: median(s["phases_s"][p] for s in per_step) for p in PHASES},
        "cpu_s_per_step": median(s["cpu_s"] for s in per_step),
        "phases_cpu_s": {p: median(s["phases_cpu_s"][p] for s in per_step) for p in PHASES},
        "cpu_us_per_token": median(s["cpu_s"] / s["tokens"] * 1e6 for s in per_step),
        "tokens_per_step": median(s["tokens"] for s in per_step),
        "collectives_per_step": ranks[0]["steps"][-1]["collectives"],
        "threads": [rank["steps"][-1]["threads"] for rank in ranks],
        "max_os_threads": max(s["threads"]["os_threads"] for rank in ranks for s in rank["steps"]),
    }


def settings_problem(preset: str, overrides: list[str]) -> str | None:
    """Why the long-response case with ``overrides`` cannot run on 1 or on 2 ranks (else None): said before any job
    starts, in the launcher."""
    from ..train.cli import load
    from ..train.registry import get_recipe

    recipe = get_recipe("grpo")
    try:
        config, _, _ = load(recipe, preset, None, [*LONG_CASE_WORK, *overrides])
    except (ValueError, FileNotFoundError) as exc:
        return f"scaling: {exc}"
    for nproc in (1, 2):
        problems = recipe.check(config, nproc)
        if problems:
            return f"scaling on {nproc} rank(s): " + "; ".join(problems)
    return None


def check_threads(job: dict, asked: int) -> None:
    """Refuse a job whose ranks ran another pool size than asked: its figures would not compare."""
    wrong = [f"rank {i}: {t['intra_op']}" for i, t in enumerate(job["threads"]) if t["intra_op"] != asked]
    if wrong:
        raise RuntimeError(f"scaling: {job['ranks']}-rank job ran {', '.join(wrong)} intra-op threads, not the "
                           f"{asked} asked (--scaling-threads): the 1- and 2-rank figures would mix thread counts")


def run(options: dict) -> dict:
    """The launcher's part: 1-rank and 2-rank jobs in turn, round after round; ratios per round."""
    from ..runtime import run as launch

    threads = options["scaling_threads"]
    with tempfile.TemporaryDirectory(prefix="accel-bench-scaling-") as scratch:
        overrides = [*LONG_CASE_WORK, *options["grpo_overrides"]]
        if not any(o.startswith("model.path=") for o in overrides):
            from ..demo_model import make_tiny_model

            overrides.append(f"model.path={make_tiny_model(Path(scratch) / 'long-case', **LONG_CASE_MODEL)}")
        job_options = {**options, "scaling_overrides": overrides}
        jobs: dict[int, list[dict]] = {1: [], 2: []}
        for _ in range(options["scaling_rounds"]):
            for nproc in jobs:
                job = summarize(launch(measure, nproc, job_options, env={"OMP_NUM_THREADS": str(threads)}))
                check_threads(job, threads)
                jobs[nproc].append(job)
    median = statistics.median
    ratios = [two["tokens_per_s"] / one["tokens_per_s"] for one, two in zip(jobs[1], jobs[2], strict=True)]
    speedups = {p: median(one["phases_s"][p] / two["phases_s"][p] for one, two in zip(jobs[1], jobs[2], strict=True)
                          if two["phases_s"][p] > 0) for p in PHASES if jobs[2][0]["phases_s"][p] > 0}
    speedups["step"] = median(one["step_s"] / two["step_s"] for one, two in zip(jobs[1], jobs[2], strict=True))
    cpu_ratio = median(two["cpu_us_per_token"] / one["cpu_us_per_token"] for one, two in zip(jobs[1], jobs[2],
                                                                                                strict=True))
    return {"threads_per_rank": threads, "rounds": options["scaling_rounds"], "steps": options["scaling_steps"],
            "overrides": overrides, "load_average": os.getloadavg(), "jobs": {str(n): v for n, v in jobs.items()},
            "ratio": median(ratios), "ratios": ratios, "phase_speedup": speedups,
            "cpu_per_token_2_over_1": cpu_ratio}


def print_scaling(s: dict) -> None:
    print(f"scaling: 1 rank against 2 ranks, the same global work, {s['threads_per_rank']} thread(s) a rank, "
          f"{s['rounds']} round(s) x {s['steps']} timed step(s); load average at the end {s['load_average'][0]:.2f}")
    print(f"  {'':<16}{'1 rank':>12}{'2 ranks':>12}{'speed-up':>10}   CPU s/step: 1 rank, 2 ranks (summed)")
    one, two = s["jobs"]["1"], s["jobs"]["2"]
    med = statistics.median
    for name in [*[p for p in PHASES if p in s["phase_speedup"]], "step"]:
        w1 = med(j["step_s"] if name == "step" else j["phases_s"][name] for j in one)
        w2 = med(j["step_s"] if name == "step" else j["phases_s"][name] for j in two)
        c1 = med(j["cpu_s_per_step"] if name == "step" else j["phases_cpu_s"][name] for j in one)
        c2 = med(j["cpu_s_per_step"] if name == "step" else j["phases_cpu_s"][name] for j in two)
        print(f"  {name:<16}{w1:>11.3f}s{w2:>11.3f}s{s['phase_speedup'][name]:>9.2f}x   {c1:.2f}, {c2:.2f}")
    t1 = med(j["tokens_per_s"] for j in one)
    t2 = med(j["tokens_per_s"] for j in two)
    print(f"  response tokens/s: 1 rank {t1:.0f}, 2 ranks {t2:.0f}; ratio {s['ratio']:.2f} "
          f"(rounds: {', '.join(f'{r:.2f}' for r in s['ratios'])}); CPU per token 2 ranks / 1 rank "
          f"{s['cpu_per_token_2_over_1']:.2f}")
    def pools(job):
        return [(t["intra_op"], t["interop"], t["os_threads"]) for t in job["threads"]]

    print(f"  threads per rank (intra-op, inter-op, OS): 1 rank {pools(one[-1])}, 2 ranks {pools(two[-1])}")
    print(f"  collectives per step (2 ranks, each rank): {two[-1]['collectives_per_step']}")
