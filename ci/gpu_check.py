"""One check of a machine with an NVIDIA GPU, run from a checkout with its preinstalled python3 (nothing installed).

Steps, each under its own time limit (room for CUDA's and NCCL's start-up) so the whole stays within 10 minutes on
one GPU: the environment, the backend listing, the tests marked ``cuda``, the conformance kit for ``cuda``,
``ci/bench.sh`` on one process with a model of about 0.5B parameters built from a config in bf16, and a short GRPO
run on such a model with the built-in character tokenizer. On 2 or more GPUs also the offload round trip on shards
2 ranks do not divide (the kit's ``engine-fsdp2`` rule) and the report card for on-policy RL on 2 ranks
(``accel-backends certify cuda --nproc 2``). Where vLLM is importable, the same GRPO run with
``rollout.engine=vllm`` (its model 1024 wide, so that vLLM's attention takes its head size). Every figure goes into
one JSON file (``--json``, default runs/gpu-check.json).

A failed step is told apart as ``packaging`` (a module missing from the image: the device was never reached),
``timeout`` or ``run`` (the step ran and failed: look at the device). Plots are optional: without matplotlib the
bench and GRPO steps note it in one line and pass.

``--cpu`` runs the same steps, the 2-rank ones included, on the CPU backend with a tiny model (checks the script
itself on any machine); ``--dry-run`` prints the commands without running them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

# About 0.5B parameters (Qwen2.5-0.5B's shape: 24 layers, hidden 896, vocab 151936), built from a config.
BENCH_MODEL = ["--hidden", "896", "--intermediate", "4864", "--layers", "24", "--heads", "14", "--kv-heads", "2",
               "--vocab", "151936", "--mixed-precision", "bf16", "--seq", "512", "--batch", "4"]
# The GRPO model uses the character tokenizer (built in code), so its size comes from width and depth alone:
# 24 layers of hidden 1536 are about 0.5B parameters.
GRPO_MODEL = ["model.hidden_size=1536", "model.layers=24", "engine.mixed_precision=bf16"]
TINY_BENCH_MODEL = ["--hidden", "32", "--layers", "2", "--seq", "16", "--switch-layers", "2,4"]
TINY_GRPO_MODEL = ["model.hidden_size=32", "model.layers=2"]
# rollout.engine=vllm: 4 heads of 256 (vLLM's GPU attention takes head sizes up to 256; its CPU build 32 and up).
VLLM_GRPO_MODEL = ["model.hidden_size=1024", "model.layers=24", "engine.mixed_precision=bf16"]
TINY_VLLM_GRPO_MODEL = ["model.hidden_size=128", "model.layers=2"]


def steps(cpu: bool, out_dir: Path, devices: int) -> list[dict]:
    """The plan: the 2-rank steps where there are 2 devices (always with ``cpu``), the vLLM run where vLLM is."""
    backend = "cpu" if cpu else "cuda"
    bench_model = TINY_BENCH_MODEL if cpu else BENCH_MODEL
    grpo_model = TINY_GRPO_MODEL if cpu else GRPO_MODEL
    bench_json = out_dir / "bench.json"
    vllm_model = TINY_VLLM_GRPO_MODEL if cpu else VLLM_GRPO_MODEL
    # The engine's rules and properties come from an entry point of the installed project; a checkout names them.
    engine_plugins = {"ACCEL_BACKENDS_PLUGINS": "engine.conformance"}
    two_ranks = [] if devices < 2 and not cpu else [
        {"name": "offload_uneven_2ranks", "limit_s": 90, "env": engine_plugins,
         "cmd": [PY, "-m", "accel_backends.testing", backend, "--nproc", "2", "--rule", "engine-fsdp2"]},
        {"name": "certify_2ranks", "limit_s": 140, "env": engine_plugins, "json": out_dir / "certify.json",
         "cmd": [PY, "-m", "accel_backends", "certify", backend, "--nproc", "2", "--json", out_dir / "certify.json"]}]
    vllm = [] if importlib.util.find_spec("vllm") is None else [
        {"name": "grpo_vllm", "limit_s": 150, "metrics": out_dir / "grpo" / "gpu-check-vllm" / "metrics.jsonl",
         "cmd": [PY, "-m", "engine.grpo.cli", "--preset", "cpu-demo", "--nproc", "1", *vllm_model,
                 "rollout.engine=vllm", "train.steps=6", "run.progress=false", f"run.output_dir={out_dir / 'grpo'}",
                 "run.name=gpu-check-vllm"]}]
    return [
        {"name": "backends", "limit_s": 30, "cmd": [PY, "-m", "accel_backends", "list", "--json"]},
        {"name": "pytest_cuda", "limit_s": 80,
         "cmd": [PY, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "tests"]},
        {"name": "conformance_kit", "limit_s": 60, "cmd": [PY, "-m", "accel_backends.testing", backend],
         "env": engine_plugins},
        {"name": "bench", "limit_s": 230, "json": bench_json,
         "cmd": ["bash", str(ROOT / "ci/bench.sh"), "--nproc", "1", *bench_model, "--steps", "3", "--switches", "3",
                 "--grpo-steps", "2", *[a for o in grpo_model for a in ("--grpo-override", o)]],
         "env": {"BENCH_PYTHON": PY, "BENCH_OUT": str(out_dir)}},
        {"name": "grpo", "limit_s": 110, "metrics": out_dir / "grpo" / "gpu-check" / "metrics.jsonl",
         "cmd": [PY, "-m", "engine.grpo.cli", "--preset", "cpu-demo", "--nproc", "1", *grpo_model, "train.steps=6",
                 "run.progress=false", f"run.output_dir={out_dir / 'grpo'}", "run.name=gpu-check"]},
        *two_ranks,
        *vllm,
    ]


def environment() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("torch", "transformers", "peft", "pluggy", "pytest", "pyarrow", "tensorboard", "matplotlib"):
        try:
            info[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - report what is missing, keep checking
            info[name] = f"missing ({exc.__class__.__name__})"
    try:
        import accel_backends

        backend = accel_backends.get_backend()
        info["selected_backend"] = backend.name
        info["device_count"] = backend.device_count()
        info["device"] = str(backend.device())
        stats = backend.memory_stats()
        info["device_memory_total_gib"] = None if stats.total is None else stats.total / 2**30
    except Exception as exc:  # noqa: BLE001
        info["selected_backend"] = f"error: {exc}"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        info["gpus"] = smi.stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        info["gpus"] = f"nvidia-smi unavailable ({exc.__class__.__name__})"
    return info


def run_step(step: dict, env: dict) -> dict:
    started = time.perf_counter()
    try:
        done = subprocess.run(step["cmd"], cwd=ROOT, env={**env, **step.get("env", {})}, capture_output=True,
                              text=True, timeout=step["limit_s"])
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", _text(exc.stdout), _text(exc.stderr) + f"\nstopped after {step['limit_s']} s"
    record = {"cmd": " ".join(map(str, step["cmd"])), "rc": rc, "ok": rc == 0,
              "seconds": round(time.perf_counter() - started, 1), "stdout_tail": out[-4000:],
              "stderr_tail": err[-3000:]}
    if rc != 0:
        record.update(failure(rc, out + err))
    if step.get("json") and Path(step["json"]).is_file():
        record["result"] = json.loads(Path(step["json"]).read_text())
    if step.get("metrics") and Path(step["metrics"]).is_file():
        record["metrics"] = [json.loads(line) for line in Path(step["metrics"]).read_text().splitlines()]
    return record


MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError: No module named|ImportError: cannot import name \S+ from) "
                            r"'([\w.]+)'")


def failure(rc, output: str) -> dict:
    """What kind of failure a step's output shows: ``packaging`` (a module the image lacks: the device was not
    reached, install it or make its use optional), ``timeout``, or ``run`` (the step itself failed)."""
    missing = MISSING_MODULE.findall(output)
    if missing:
        return {"failure": "packaging", "missing_module": missing[-1]}
    return {"failure": "timeout" if rc == "timeout" else "run"}


def verdict(record: dict) -> str:
    if record["failure"] == "packaging":
        return f"FAILED (packaging: no module {record['missing_module']!r} in this image; the device was not reached)"
    return f"FAILED ({record['failure']}, rc={record['rc']})"


def device_count() -> int:
    """GPUs the cuda backend sees (0 where it cannot say): the 2-rank steps need two."""
    try:
        from accel_backends.registry import registry

        backend = registry().get("cuda").backend
        return backend.device_count() if backend.is_available() else 0
    except Exception:  # noqa: BLE001 - no count, no 2-rank steps; the environment step says why
        return 0


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the CPU backend and a tiny model (checks the script)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--json", type=Path, default=ROOT / "runs/gpu-check.json")
    parser.add_argument("--only", default=None, help="comma-separated step names to run (default: all)")
    args = parser.parse_args()
    out_dir = args.json.parent / (args.json.stem + "-files")
    plan = steps(args.cpu, out_dir, 0 if args.cpu else device_count())
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {s["name"] for s in plan}
        if unknown:
            parser.error(f"unknown step(s) {', '.join(sorted(unknown))}: choose from "
                         f"{', '.join(s['name'] for s in plan)}")
        plan = [s for s in plan if s["name"] in wanted]
    if args.dry_run:
        for step in plan:
            print(f"[{step['name']}, {step['limit_s']} s] {' '.join(map(str, step['cmd']))}")
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.cpu:
        env.update(ACCEL_BACKEND="cpu", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": "cpu" if args.cpu else "gpu",
              "environment": environment(), "steps": {}}
    started = time.perf_counter()
    for step in plan:
        print(f"gpu-check: {step['name']} (limit {step['limit_s']} s) ...", flush=True)
        record = report["steps"][step["name"]] = run_step(step, env)
        print(f"gpu-check: {step['name']}: {'ok' if record['ok'] else verdict(record)} in {record['seconds']} s",
              flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))  # after every step: a later timeout keeps the rest
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    report["all_ok"] = all(r["ok"] for r in report["steps"].values())
    for kind in ("packaging", "timeout", "run"):
        report[f"{kind}_failures"] = [name for name, r in report["steps"].items() if r.get("failure") == kind]
    args.json.write_text(json.dumps(report, indent=2))
    failed = ", ".join(f"{kind}: {' '.join(report[kind + '_failures'])}" for kind in ("packaging", "timeout", "run")
                       if report[kind + "_failures"])
    print(f"gpu-check: {'all steps passed' if report['all_ok'] else 'some steps FAILED (' + failed + ')'} in "
          f"{report['total_seconds']} s; figures in {args.json}")
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
