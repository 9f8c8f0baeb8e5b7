"""One check of a machine with a GPU, sized for a lent slot of about 10 minutes: run from a checkout with the image's
python3 (torch, transformers, peft, pluggy, pytest, pyarrow, tensorboard; nothing installed; ``PYTHONPATH=.``).

Steps, each under its own time limit and all under one deadline (``--budget``, 580 s; the wrapper stops everything
at 595 s), so one hung step cannot eat the others:
  environment and backend listing; the tests marked ``cuda``; the conformance kit (its multi-process rules on as
  many processes as there are devices, up to 2); the report card in fp32 and in bf16 (on one device a one-process
  card plus the multi-rank properties as rank 1 of 2 on torch's fake process group); for each ``--geometry``
  (default qwen2.5-0.5b and qwen3-1.7b: the real layer, head and vocabulary counts, random weights built from a
  config) a model directory, a GRPO run and an SFT run with packed micro-batches in bf16 (tokens/s, MFU per phase
  where the step metrics carry ``perf/mfu/<phase>``, peak memory); the bench's ``overhead`` scenario (the engine's
  step against a hand-written FSDP2 loop: what the engine costs) at Qwen2.5-0.5B's geometry.

Everything comes back in the output folder (``$OUT`` when set, else runs/gpu-check; ``--out``): ``gpu-check.json``,
``gpu-check.md`` and ``gpu-check.log`` (``ci/gpu_check_report.py``), rewritten as each step ends. Scratch (model
directories, checkpoints) goes to a temporary folder, in /dev/shm where it has room, removed at the end.

A failed step is told apart as ``packaging`` (a module missing from the image: the device was never reached),
``timeout`` or ``run``. ``--cpu`` is the rehearsal: the same steps on the CPU backend as on one device, at the
``tiny`` geometry (CI runs it, tests/test_gpu_check.py); ``--dry-run`` prints the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from geometry import GEOMETRIES
from gpu_check_report import Report, step_figures

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BUDGET_S = 580  # the wrapper's timeout is 595 s
GPU_GEOMETRIES = ("qwen2.5-0.5b", "qwen3-1.7b")
BENCH_MODEL = ["--hidden", "896", "--intermediate", "4864", "--layers", "24", "--heads", "14", "--kv-heads", "2",
               "--vocab", "151936", "--mixed-precision", "bf16", "--seq", "512", "--batch", "4"]
TINY_BENCH_MODEL = ["--hidden", "32", "--layers", "2", "--seq", "16"]
PLUGINS = {"ACCEL_BACKENDS_PLUGINS": "engine.conformance"}  # the engine's rules and card properties, in a checkout
# The rollout card's properties live in the RL layer (the engine's core must not import it): named as well.
ROLLOUT_PLUGINS = {"ACCEL_BACKENDS_PLUGINS": "engine.conformance,engine.rl.certify_rollout"}


def geometry_steps(name: str, cpu: bool, work: Path) -> list[dict]:
    """A model directory at ``name``'s geometry, then one GRPO and one SFT run on it (packed micro-batches)."""
    model, runs = work / "models" / name, work / "runs"
    common = [f"model.path={model}", "run.progress=false", f"run.output_dir={runs}", "run.loggers=[jsonl]"]
    if not cpu:
        common.append("engine.mixed_precision=bf16")
    grpo = ["train.steps=1"] if cpu else ["train.steps=2", "rollout.max_new_tokens=64"]
    sft = ["train.steps=1"] if cpu else ["train.steps=3"]
    big = name == "qwen3-1.7b"
    return [
        {"name": f"model_{name}", "limit_s": 25,
         "cmd": [PY, "ci/geometry.py", model, "--geometry", name]},
        {"name": f"grpo_{name}", "limit_s": 85 if big else 55, "metrics": runs / f"grpo-{name}" / "metrics.jsonl",
         "cmd": [PY, "-m", "engine.rl.algorithms.grpo.cli", "--preset", "cpu-demo", "--nproc", "1", *common, *grpo,
                 f"run.name=grpo-{name}"]},
        {"name": f"sft_{name}", "limit_s": 60 if big else 55, "metrics": runs / f"sft-{name}" / "metrics.jsonl",
         "cmd": [PY, "-m", "engine.offline.objectives.sft.cli", "--preset", "cpu-demo", "--nproc", "1", *common, *sft,
                 f"run.name=sft-{name}"]},
    ]


def steps(cpu: bool, work: Path, devices: int, geometries: list[str]) -> list[dict]:
    """The plan. One device (and ``--cpu``): every multi-process rule and card on one process, the card's
    multi-rank properties on the fake group; two or more: both on 2 processes."""
    backend = "cpu" if cpu else "cuda"
    nproc = "1" if cpu or devices < 2 else "2"
    cards = [{"name": f"card_{precision}", "limit_s": 45, "env": PLUGINS, "json": work / f"card-{precision}.json",
              "card": True, "cmd": [PY, "-m", "accel_backends", "certify", backend, "--nproc", nproc,
                                    "--precision", precision, "--json", work / f"card-{precision}.json"]}
             for precision in ("fp32", "bf16")]
    # The rollout side (issue 48): the continuous-batching engine against the policy on the device, in bf16.
    cards.append({"name": "rollout_card", "limit_s": 35, "env": ROLLOUT_PLUGINS, "json": work / "rollout-card.json",
                  "card": True, "cmd": [PY, "-m", "accel_backends", "certify", backend, "--rollout", "hf-continuous",
                                        "--precision", "bf16", "--json", work / "rollout-card.json"]})
    # The cuda-marked tests but the conformance kit's, which the next step runs itself (on a CPU they skip).
    cuda_tests = ["tests/test_cuda_backend.py"] + ([] if cpu else ["tests/test_engine_cuda.py"])
    return [
        {"name": "backends", "limit_s": 10, "cmd": [PY, "-m", "accel_backends", "list", "--json"]},
        {"name": "pytest_cuda", "limit_s": 60,
         "cmd": [PY, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", *cuda_tests]},
        {"name": "conformance_kit", "limit_s": 35, "env": PLUGINS,
         "cmd": [PY, "-m", "accel_backends.testing", backend, "--nproc", nproc]},
        *cards,
        *[step for name in geometries for step in geometry_steps(name, cpu, work)],
        {"name": "bench_overhead", "limit_s": 45, "json": work / "bench.json",
         "cmd": [PY, "-m", "engine.bench", "--nproc", "1", "--scenarios", "overhead", "--steps", "3",
                 *(TINY_BENCH_MODEL if cpu else BENCH_MODEL), "--json", work / "bench.json"]},
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
        info.update(selected_backend=backend.name, device_count=backend.device_count(), device=str(backend.device()))
        stats = backend.memory_stats()
        info["device_memory_total_gib"] = None if stats.total is None else stats.total / 2**30
        peak = getattr(backend, "peak_flops", None)  # DeviceBackend.peak_flops(dtype), where this version has it
        info["peak_flops_bf16"] = peak(__import__("torch").bfloat16) if callable(peak) else "n/a"
    except Exception as exc:  # noqa: BLE001
        info["selected_backend"] = f"error: {exc}"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        info["gpus"] = smi.stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        info["gpus"] = f"nvidia-smi unavailable ({exc.__class__.__name__})"
    return info


def run_step(step: dict, env: dict, limit_s: float) -> tuple[dict, str]:
    """Run one step under ``limit_s``; its record (figures, card) and its whole output for the log."""
    started = time.perf_counter()
    # A session of its own: on timeout the whole group goes (a trainer's workers too, and the device memory
    # they hold), so the next step starts on a free device.
    proc = subprocess.Popen([str(c) for c in step["cmd"]], cwd=ROOT, env={**env, **step.get("env", {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc, err = "timeout", err + f"\nstopped after {limit_s:.0f} s"
    record = {"cmd": " ".join(map(str, step["cmd"])), "rc": rc, "ok": rc == 0, "limit_s": round(limit_s),
              "seconds": round(time.perf_counter() - started, 1)}
    if rc != 0:
        record.update(failure(rc, out + err))
    if step.get("json") and Path(step["json"]).is_file():
        record["result"] = json.loads(Path(step["json"]).read_text())
    if step.get("card"):
        record["card_markdown"] = out.split("\ncard written to")[0].strip()
    if step.get("metrics") and Path(step["metrics"]).is_file():
        record["metrics"] = [json.loads(line) for line in Path(step["metrics"]).read_text().splitlines()]
        record["figures"] = step_figures(record["metrics"])
    return record, f"{out}\n{err}"


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
    """GPUs the cuda backend sees (0 where it cannot say)."""
    try:
        from accel_backends.registry import registry

        backend = registry().get("cuda").backend
        return backend.device_count() if backend.is_available() else 0
    except Exception:  # noqa: BLE001 - no count: the one-device plan; the environment step says why
        return 0


def scratch_parent() -> str | None:
    """/dev/shm where it is writable and holds the 1.7B model's checkpoint (weights and AdamW state, ~21 GB; a
    container's default /dev/shm is 64 MiB), else the system's temporary folder."""
    try:
        roomy = os.access("/dev/shm", os.W_OK) and shutil.disk_usage("/dev/shm").free > 32 * 2**30
    except OSError:
        roomy = False
    return "/dev/shm" if roomy else None


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the rehearsal: CPU backend, tiny geometry")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "runs/gpu-check"),
                        help="the output folder (default $OUT, else runs/gpu-check)")
    parser.add_argument("--geometry", action="append", choices=sorted(GEOMETRIES),
                        help="a geometry for the GRPO and SFT steps (repeatable; default: qwen2.5-0.5b and "
                             "qwen3-1.7b on a GPU, tiny with --cpu)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds for all steps (default {BUDGET_S})")
    parser.add_argument("--only", default=None, help="comma-separated step names to run (default: all)")
    args = parser.parse_args(argv)
    args.geometry = args.geometry or (["tiny"] if args.cpu else list(GPU_GEOMETRIES))
    return parser, args


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=scratch_parent()))
    plan = steps(args.cpu, work, 0 if args.cpu else device_count(), args.geometry)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {s["name"] for s in plan}
        if unknown:
            shutil.rmtree(work, ignore_errors=True)
            parser.error(f"unknown step(s) {', '.join(sorted(unknown))}: choose from "
                         f"{', '.join(s['name'] for s in plan)}")
        plan = [s for s in plan if s["name"] in wanted]
    if args.dry_run:
        shutil.rmtree(work, ignore_errors=True)
        for step in plan:
            print(f"[{step['name']}, {step['limit_s']} s] {' '.join(map(str, step['cmd']))}")
        return 0
    try:
        return run_plan(plan, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_plan(plan: list[dict], args, work: Path) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.cpu:
        env.update(ACCEL_BACKEND="cpu", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    started = time.perf_counter()
    report = Report(args.out, {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "mode": "cpu" if args.cpu else "gpu", "geometries": args.geometry,
                               "budget_s": args.budget, "environment": environment(), "steps": {}})
    for step in plan:
        left = args.budget - (time.perf_counter() - started)
        if left < 5:
            record = {"cmd": " ".join(map(str, step["cmd"])), "rc": "not run", "ok": False, "limit_s": 0,
                      "seconds": 0.0, "failure": "timeout"}
            report.step_done(step["name"], record, f"not run: the check's {args.budget:.0f} s were spent")
            continue
        limit = min(step["limit_s"], left)
        print(f"gpu-check: {step['name']} (limit {limit:.0f} s) ...", flush=True)
        record, output = run_step(step, env, limit)
        report.step_done(step["name"], record, output)
        print(f"gpu-check: {step['name']}: {'ok' if record['ok'] else verdict(record)} in {record['seconds']} s",
              flush=True)
    doc = report.doc
    doc["total_seconds"] = round(time.perf_counter() - started, 1)
    doc["all_ok"] = all(r["ok"] for r in doc["steps"].values())
    for kind in ("packaging", "timeout", "run"):
        doc[f"{kind}_failures"] = [name for name, r in doc["steps"].items() if r.get("failure") == kind]
    report.write()
    failed = ", ".join(f"{kind}: {' '.join(doc[kind + '_failures'])}" for kind in ("packaging", "timeout", "run")
                       if doc[kind + "_failures"])
    print(f"gpu-check: {'all steps passed' if doc['all_ok'] else 'some steps FAILED (' + failed + ')'} in "
          f"{doc['total_seconds']} s; results in {args.out}")
    return 0 if doc["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
