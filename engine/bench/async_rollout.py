"""``accel-bench --scenarios async_rollout``: GRPO with one trainer process and one vLLM server process at
``rollout.max_staleness`` 0, 1 and 2, against the colocated vLLM engine on 2 ranks (issue 29, items 7-8).

It runs in the launching process (it starts processes of its own, not the benchmark's workers) and needs vLLM
(the vLLM leg's environment). It writes the mid-size model (hidden 512 x 8; or ``--async-model-dir``) and runs
one of two cases (``--async-case``): ``mid``, 16 prompts x 8 responses of up to 128 tokens, and ``long``, 4 x 8
of up to 512 (about as many response tokens a step, in sequences 4x as long). It starts one server per binding
and runs ``accel-grpo`` once per variant and round, the variants interleaved (k0, k1, k2, colocated, k0, ...).
From each run's ``metrics.jsonl``, after the warm-up steps and before the last (when a thread ahead has nothing
left to sample): response tokens per second (``rollout_tokens_produced`` over ``step_time_s``), the overlap
achieved ((sampling time + training time) / step time, sampling time = ``rollout/sampler_busy_frac`` x step,
training time = step - ``time/trainer_wait_s``; 1.0 when nothing overlaps) and the step time over the slower
side's.

Bindings (``--async-bindings``): ``unbound`` (the OS places the server's and the trainer's threads), ``split``
(the server's processes and threads on the last allowed core, the trainer on the others) and ``lend`` (the server
on the last core, the trainer on every core with ``rollout.vllm.borrow_threads`` = the server's cores: it computes
on them while the server idles). The colocated variant is never bound (two ranks over the cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {"server_k0": 0, "server_k1": 1, "server_k2": 2, "colocated_2_ranks": None}
MID_MODEL = {"hidden_size": 512, "layers": 8, "vocab_size": 2048, "eos_bias": 0.33, "single_eos": True}
# --async-case: prompts per step and the response limit (mid: the mid-size geometry; long: 4x longer
# responses, a quarter of the prompts, so about as many response tokens a step).
CASES = {"mid": {"prompts": 16, "max_new_tokens": 128}, "long": {"prompts": 4, "max_new_tokens": 512}}
PROMPT_ROOM = 128  # an echo prompt's tokens, at most


def work(case: str) -> list[str]:
    """The overrides every run of ``case`` shares."""
    geometry = CASES[case]
    return [f"train.prompts_per_step={geometry['prompts']}", "rollout.n=8",
            f"rollout.max_new_tokens={geometry['max_new_tokens']}", "data.task=echo", "rollout.engine=vllm",
            "rollout.vllm.kv_cache_gib=1", "run.progress=false", "run.save_every=0"]


def max_model_len(case: str) -> int:
    return PROMPT_ROOM + CASES[case]["max_new_tokens"]


def _threads_of(pid: int) -> list[int]:
    """The thread ids of ``pid`` and of every process under it."""
    import psutil

    processes = [psutil.Process(pid)]
    processes += processes[0].children(recursive=True)
    return [int(tid) for p in processes for tid in os.listdir(f"/proc/{p.pid}/task")]


def bind_tree(pid: int, cores: set[int]) -> int:
    """Every thread of ``pid``'s process tree on ``cores`` (threads keep their own affinity, so each is set);
    returns how many were bound."""
    bound = 0
    for tid in _threads_of(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(tid, cores)
            bound += 1
    return bound


@contextlib.contextmanager
def local_server(model: Path, threads: int, cores: set[int] | None, log_dir: Path, context: int):
    """One vLLM server serving ``model`` as the trainer would start it, with ``threads`` threads, bound to
    ``cores`` when given; yields its URL."""
    import accel_backends
    from accel_backends.spawn import free_port

    from ..rollout.engines.vllm_settings import VLLMConfig
    from ..rollout.vllm_server.manager import ServerManager
    from ..rollout.vllm_server.plan import server_options, server_specs

    settings = VLLMConfig(mode="server", kv_cache_gib=1.0)
    facts = accel_backends.get_backend().inference_engine_facts()
    specs = server_specs(settings, facts, None, server_options(settings, facts, "float32", "auto", context),
                         free_port)
    specs[0].env["OMP_NUM_THREADS"] = str(threads)
    manager = ServerManager(model, specs, log_dir)
    (url,) = manager.start()
    try:
        if cores is not None:
            bind_tree(manager.processes[0].pid, cores)
        yield url
    finally:
        manager.stop()


def one_run(model: Path, variant: str, url: str, options: dict, out_dir: Path, threads: int,
            cores: set[int] | None, borrow: int = 0) -> dict:
    """One ``accel-grpo`` run of ``variant`` (on ``cores`` when given, borrowing ``borrow`` threads from the idle
    server); its figures after the warm-up steps."""
    bound = VARIANTS[variant]
    name = f"{variant}-{len(list(out_dir.glob(variant + '-*')))}"
    overrides = [*work(options["async_case"]), f"model.path={model}", f"train.steps={options['async_steps']}",
                 f"run.output_dir={out_dir}", f"run.name={name}"]
    if bound is None:
        nproc, overrides = 2, overrides + ["rollout.vllm.mode=colocate"]
    else:
        nproc = 1
        overrides += ["rollout.vllm.mode=server", f"rollout.vllm.server_urls=[{url}]",
                      f"rollout.max_staleness={bound}", f"rollout.partial={str(options['async_partial']).lower()}",
                      f"rollout.vllm.borrow_threads={borrow}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "engine.grpo.cli", "--nproc", str(nproc), *overrides], env=env,
                            capture_output=True, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores and bound is not None
                            else None)
    if result.returncode != 0:
        raise RuntimeError(f"async_rollout: the {variant} run failed: {result.stderr.strip()[-2000:]}")
    rows = [json.loads(line) for line in (out_dir / name / "metrics.jsonl").read_text().splitlines()]
    # The last step is left out too: a thread ahead has nothing left to sample then (the pipeline drains).
    return {"run_s": time.perf_counter() - started, **figures(rows[options["async_warmup"]:-1])}


def figures(rows: list[dict]) -> dict:
    """Throughput, overlap and the step against its slower side, from the timed steps' metrics rows."""
    steps = [row["step_time_s"] for row in rows]
    sampling = [row["rollout/sampler_busy_frac"] * row["step_time_s"] for row in rows]
    training = [row["step_time_s"] - row["time/trainer_wait_s"] for row in rows]
    return {"steps": len(rows), "tokens_per_s": sum(row["rollout_tokens_produced"] for row in rows) / sum(steps),
            "step_s": statistics.median(steps), "sampling_s": statistics.median(sampling),
            "training_s": statistics.median(training), "trainer_wait_s": statistics.median(
                row["time/trainer_wait_s"] for row in rows),
            "overlap": statistics.median((s + t) / step for s, t, step in zip(sampling, training, steps, strict=True)),
            "step_over_slower_side": statistics.median(step / max(s, t, 1e-9) for s, t, step in
                                                       zip(sampling, training, steps, strict=True)),
            "staleness_max": max(row["rollout/staleness_max"] for row in rows),
            "response_length": statistics.mean(row["response_length"] for row in rows)}


def _ratios(runs: dict[str, list[dict]], numerator: str, denominator: str) -> float | None:
    """The median over rounds of each round's throughput ratio."""
    if numerator not in runs or denominator not in runs:
        return None
    return statistics.median(a["tokens_per_s"] / b["tokens_per_s"]
                             for a, b in zip(runs[numerator], runs[denominator], strict=True))


def run(options: dict) -> dict:
    """Every binding: a server, then the variants interleaved over the rounds."""
    from ..demo_model import make_tiny_model

    allowed = sorted(os.sched_getaffinity(0))
    threads = options["async_threads"]
    result = {"case": options["async_case"], **CASES[options["async_case"]], "steps": options["async_steps"],
              "warmup": options["async_warmup"], "threads": threads,
              "cores": allowed, "bindings": {}}
    with tempfile.TemporaryDirectory(prefix="accel-bench-async-") as scratch:
        scratch = Path(scratch)
        model = Path(options["async_model_dir"] or make_tiny_model(scratch / "mid", **MID_MODEL))
        for binding in options["async_bindings"]:
            server_cores = {allowed[-1]} if binding in ("split", "lend") and len(allowed) > 1 else None
            trainer_cores = None if not server_cores else set(allowed) if binding == "lend" else set(allowed[:-1])
            borrow = len(server_cores) if server_cores and binding == "lend" else 0
            runs: dict[str, list[dict]] = {name: [] for name in options["async_variants"]}
            with local_server(model, threads, server_cores, scratch / f"logs-{binding}",
                              max_model_len(options["async_case"])) as url:
                for _ in range(options["async_rounds"]):
                    for name in runs:
                        runs[name].append(one_run(model, name, url, options, scratch / "runs", threads,
                                                  trainer_cores, borrow))
            row = {"runs": runs, "server_cores": sorted(server_cores or []),
                   "trainer_cores": sorted(trainer_cores or []), "borrow_threads": borrow}
            for k in (1, 2):
                row[f"k{k}_over_k0"] = _ratios(runs, f"server_k{k}", "server_k0")
                row[f"k{k}_over_colocated"] = _ratios(runs, f"server_k{k}", "colocated_2_ranks")
            result["bindings"][binding] = row
    return result
