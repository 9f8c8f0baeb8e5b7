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

Bindings (``--async-bindings``), each setting named: ``unbound`` (the OS places the server's and the trainer's
threads), ``split`` (the server's processes and threads on the last allowed core, the trainer on the others) and
``lend`` (the server on the last core, the trainer on every core with ``rollout.vllm.borrow_threads`` = the
server's cores: it computes on them while the server idles); these start one server that every server run of the
binding uses (``rollout.vllm.server_urls``), with ``--async-threads`` threads per process. And the defaults:
``auto``, where each server run starts its own server with nothing set but ``rollout.vllm.mode=server
rollout.vllm.servers=1 rollout.max_staleness=k`` (``borrow_threads=auto`` places both sides and borrows; no
``OMP_NUM_THREADS`` for any run), and ``auto-lend`` / ``auto-split``, the same with ``auto``'s binding chosen
(``ACCEL_BORROW_BINDING``), to measure one against the other. What ``auto`` chose is recorded per run (its
``config.json``). The colocated variant is never bound (two ranks over the cores).
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

from ..rollout.vllm_server.cores import BINDING_ENV

VARIANTS = {"server_k0": 0, "server_k1": 1, "server_k2": 2, "colocated_2_ranks": None}
MID_MODEL = {"hidden_size": 512, "layers": 8, "vocab_size": 2048, "eos_bias": 0.33, "single_eos": True}
# --async-case: prompts per step and the response limit (mid: the mid-size geometry; long: 4x longer
# responses, a quarter of the prompts, so about as many response tokens a step).
CASES = {"mid": {"prompts": 16, "max_new_tokens": 128}, "long": {"prompts": 4, "max_new_tokens": 512}}
PROMPT_ROOM = 128  # an echo prompt's tokens, at most
BINDINGS = ("unbound", "split", "lend", "auto", "auto-lend", "auto-split")


def work(case: str) -> list[str]:
    """The overrides every run of ``case`` shares."""
    geometry = CASES[case]
    return [f"train.prompts_per_step={geometry['prompts']}", "rollout.n=8",
            f"rollout.max_new_tokens={geometry['max_new_tokens']}", "data.task=echo", "rollout.engine=vllm",
            "rollout.vllm.kv_cache_gib=1", "run.progress=false", "run.save_every=0"]


def max_model_len(case: str) -> int:
    return PROMPT_ROOM + CASES[case]["max_new_tokens"]


@contextlib.contextmanager
def local_server(model: Path, threads: int, cores: set[int] | None, log_dir: Path, context: int):
    """One vLLM server serving ``model`` as the trainer would start it, with ``threads`` threads, bound to
    ``cores`` when given; yields its URL."""
    import accel_backends
    from accel_backends.spawn import free_port

    from ..rollout.engines.vllm_settings import VLLMConfig
    from ..rollout.vllm_server.access import KEY_ENV
    from ..rollout.vllm_server.manager import ServerManager
    from ..rollout.vllm_server.plan import server_options, server_specs

    settings = VLLMConfig(mode="server", kv_cache_gib=1.0)
    facts = accel_backends.get_backend().inference_engine_facts()
    specs = server_specs(settings, facts, None, server_options(settings, facts, "float32", "auto", context),
                         free_port)
    specs[0].env["OMP_NUM_THREADS"] = str(threads)
    specs[0].cores = sorted(cores or [])  # its guard binds every process and thread it starts
    manager = ServerManager(model, specs, log_dir)
    (url,) = manager.start()
    before = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = manager.api_key  # the runs reach it as a user's server (server_urls): by VLLM_API_KEY
    try:
        yield url
    finally:
        manager.stop()
        if before is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = before


def launch(variant: str, binding: str, url: str | None, options: dict, threads: int, borrow: int) -> tuple:
    """``(nproc, overrides, environment)`` of one run beyond the work: the settings named (bound bindings) or the
    defaults only (``auto*``)."""
    bound = VARIANTS[variant]
    env = dict(os.environ)
    if binding.startswith("auto"):
        env.pop("OMP_NUM_THREADS", None)
        env.pop(BINDING_ENV, None)
        if binding != "auto":
            env[BINDING_ENV] = binding.removeprefix("auto-")
    else:
        env["OMP_NUM_THREADS"] = str(threads)
    partial = [f"rollout.partial={str(options['async_partial']).lower()}"] if options["async_partial"] else []
    if bound is None:
        return 2, ["rollout.vllm.mode=colocate"], env
    if binding.startswith("auto"):
        return 1, ["rollout.vllm.mode=server", "rollout.vllm.servers=1", f"rollout.max_staleness={bound}",
                   *partial], env
    return 1, ["rollout.vllm.mode=server", f"rollout.vllm.server_urls=[{url}]", f"rollout.max_staleness={bound}",
               *partial, f"rollout.vllm.borrow_threads={borrow}"], env


def one_run(model: Path, variant: str, url: str | None, options: dict, out_dir: Path, threads: int,
            cores: set[int] | None, borrow: int = 0, binding: str = "split") -> dict:
    """One ``accel-grpo`` run of ``variant`` under ``binding`` (on ``cores`` when given, borrowing ``borrow``
    threads from the idle server); its figures after the warm-up steps, and what ``auto`` chose."""
    name = f"{variant}-{len(list(out_dir.glob(variant + '-*')))}"
    nproc, settings, env = launch(variant, binding, url, options, threads, borrow)
    overrides = [*work(options["async_case"]), f"model.path={model}", f"train.steps={options['async_steps']}",
                 f"run.output_dir={out_dir}", f"run.name={name}", *settings]
    started = time.perf_counter()
    pinned = cores and VARIANTS[variant] is not None
    result = subprocess.run([sys.executable, "-m", "engine.rl.algorithms.grpo.cli",
                             "--nproc", str(nproc), *overrides], env=env,
                            capture_output=True, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if pinned else None)
    if result.returncode != 0:
        raise RuntimeError(f"async_rollout: the {variant} run failed: {result.stderr.strip()[-2000:]}")
    rows = [json.loads(line) for line in (out_dir / name / "metrics.jsonl").read_text().splitlines()]
    chosen = json.loads((out_dir / name / "config.json").read_text())["derived"].get("borrow_threads")
    # The last step is left out too: a thread ahead has nothing left to sample then (the pipeline drains).
    return {"run_s": time.perf_counter() - started, **figures(rows[options["async_warmup"]:-1]),
            **({"borrowing": chosen} if chosen else {})}


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
            server = contextlib.nullcontext() if binding.startswith("auto") else local_server(
                model, threads, server_cores, scratch / f"logs-{binding}", max_model_len(options["async_case"]))
            with server as url:
                for _ in range(options["async_rounds"]):
                    for name in runs:
                        runs[name].append(one_run(model, name, url, options, scratch / "runs", threads,
                                                  trainer_cores, borrow, binding))
            row = {"runs": runs, "server_cores": sorted(server_cores or []),
                   "trainer_cores": sorted(trainer_cores or []), "borrow_threads": borrow}
            chosen = [run["borrowing"] for name in runs for run in runs[name] if "borrowing" in run]
            if binding.startswith("auto") and chosen:
                row.update(borrow_threads=chosen[0]["threads"], auto=chosen[0],
                           server_cores=(chosen[0].get("server_cores") or [[]])[0],
                           trainer_cores=chosen[0].get("trainer_cores", []))
            for k in (1, 2):
                row[f"k{k}_over_k0"] = _ratios(runs, f"server_k{k}", "server_k0")
                row[f"k{k}_over_colocated"] = _ratios(runs, f"server_k{k}", "colocated_2_ranks")
            result["bindings"][binding] = row
    return result
