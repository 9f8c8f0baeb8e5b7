"""ci/gpu-check.sh, the check made for one lent GPU slot: its CPU rehearsal (the same script, tiny geometry) leaves
the report card in fp32 and bf16, the GRPO/SFT step figures and the log under $OUT; the plan fits the slot; a step
left without time is recorded, not lost."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "ci"))  # gpu_check.py imports its sibling modules, as it does when run as a script
spec = importlib.util.spec_from_file_location("gpu_check", REPO / "ci" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

from gpu_check_report import step_figures  # noqa: E402

CARD = ("reductions", "offload", "gradients", "packing", "grad-sync", "checkpoint", "weight-push", "logprob-gap",
        "same-seed", "host-reads", "offload (rank 1 of 2, fake group)")


@pytest.mark.slow
def test_the_cpu_rehearsal_leaves_cards_step_figures_and_log_under_out(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_BACKEND")}
    # As on the GPU image, where the checkout is not installed: no entry point of ours is read.
    env.update(OUT=str(out), PYTHON=sys.executable, OMP_NUM_THREADS="1", ACCEL_BACKENDS_AUTOLOAD="0")
    done = subprocess.run(["bash", str(REPO / "ci/gpu-check.sh"), "--cpu"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=480)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.json", "gpu-check.log", "gpu-check.md"]
    doc = json.loads((out / "gpu-check.json").read_text())
    assert doc["mode"] == "cpu" and doc["all_ok"] is True and doc["geometries"] == ["tiny"]
    steps = doc["steps"]
    assert list(steps) == ["backends", "pytest_cuda", "conformance_kit", "card_fp32", "card_bf16", "rollout_card",
                           "model_tiny", "grpo_tiny", "sft_tiny", "bench_overhead"]
    rollout_card = {p["name"]: p["status"] for p in steps["rollout_card"]["result"]["properties"]}
    assert steps["rollout_card"]["result"]["rollout"] == "hf-continuous"
    assert rollout_card["prefix-cache"] == rollout_card["rollout-logprob-gap"] == "holds"
    for precision in ("fp32", "bf16"):
        card = steps[f"card_{precision}"]["result"]
        assert card["precision"] == precision and card["nproc"] == 1 and card["all_hold"] is True
        verdicts = {p["name"]: p for p in card["properties"]}
        assert tuple(verdicts) == CARD and {p["status"] for p in verdicts.values()} == {"holds"}
        assert "shards shorter than their padded size on rank 1" in verdicts[CARD[-1]]["detail"]
    bf16 = {p["name"]: p for p in steps["card_bf16"]["result"]["properties"]}
    assert bf16["gradients"]["bound"] == "<= 0.02" and bf16["logprob-gap"]["bound"] == "<= 0.05"
    assert 0 < bf16["gradients"]["figure"] <= 0.02  # bf16 really ran: float32 lands near 1e-7
    for run in ("grpo_tiny", "sft_tiny"):
        figures = steps[run]["figures"]
        assert figures["tokens_per_s"] > 0 and figures["peak_memory_gib"] > 0 and figures["steps"] == 1
        assert "perf/mfu" in figures and "mfu_per_phase" in figures  # a number where the metrics carry it, or n/a
    grpo_peaks = steps["grpo_tiny"]["figures"]["peak_memory_gib_per_phase"]  # measured per phase, even on the CPU
    assert set(grpo_peaks) == {"rollout", "update"} and all(value > 0 for value in grpo_peaks.values()), grpo_peaks
    assert steps["bench_overhead"]["result"]["scenarios"]["overhead"]
    card_md = (out / "gpu-check.md").read_text()
    assert "(1 processes, fp32)" in card_md and "(1 processes, bf16)" in card_md
    assert "| offload (rank 1 of 2, fake group) |" in card_md and "| grpo_tiny |" in card_md
    assert "## Engine overhead: the engine's step over a hand-written FSDP2 loop" in card_md
    log = (out / "gpu-check.log").read_text()
    assert all(f"===== {name}: ok" in log for name in steps)


def test_the_gpu_plan_fits_the_slot_and_runs_the_card_on_one_device():
    plan = gpu_check.steps(False, REPO / "work", 1, list(gpu_check.GPU_GEOMETRIES))
    names = [step["name"] for step in plan]
    assert names == ["backends", "pytest_cuda", "conformance_kit", "card_fp32", "card_bf16", "rollout_card",
                     "model_qwen2.5-0.5b",
                     "grpo_qwen2.5-0.5b", "sft_qwen2.5-0.5b", "model_qwen3-1.7b", "grpo_qwen3-1.7b",
                     "sft_qwen3-1.7b", "bench_overhead"]
    assert sum(step["limit_s"] for step in plan) <= gpu_check.BUDGET_S <= 595 - 15
    card = " ".join(map(str, plan[4]["cmd"]))
    assert "certify cuda --nproc 1 --precision bf16" in card
    assert "engine.mixed_precision=bf16" in plan[7]["cmd"]
    assert "--nproc 2" in " ".join(map(str, gpu_check.steps(False, REPO / "work", 2, [])[2]["cmd"]))
    assert "timeout -k 10 595" in (REPO / "ci/gpu-check.sh").read_text()
    assert plan[5]["env"]["ACCEL_BACKENDS_PLUGINS"].split(",") == ["engine.conformance", "engine.rl.certify_rollout"]


def test_a_step_left_without_time_is_recorded_and_bad_names_are_refused(tmp_path, capsys):
    """In this process: neither case starts a step (the script's own process is the rehearsal's)."""
    assert gpu_check.main(["--cpu", "--budget", "0", "--only", "backends", "--out", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / "gpu-check.json").read_text())
    assert doc["steps"]["backends"]["rc"] == "not run" and doc["timeout_failures"] == ["backends"]
    with pytest.raises(SystemExit) as refused:
        gpu_check.main(["--only", "warp"])
    assert refused.value.code == 2 and "unknown step(s) warp" in capsys.readouterr().err


def test_step_figures_read_mfu_per_phase_where_the_metrics_carry_it():
    with_mfu = step_figures([{"tokens_per_s": 1.0}, {"tokens_per_s": 9.0, "perf/mfu": 0.12, "perf/mfu/update": 0.2,
                                                     "perf/mfu/rollout": 0.05, "peak_memory_gib": 3.0}])
    assert with_mfu["tokens_per_s"] == 9.0 and with_mfu["steps"] == 2 and with_mfu["perf/mfu"] == 0.12
    assert with_mfu["mfu_per_phase"] == {"update": 0.2, "rollout": 0.05}
    without = step_figures([{"tokens_per_s": 9.0}])
    assert without["perf/mfu"] == "n/a" and without["mfu_per_phase"] == "n/a" and without["peak_memory_gib"] == "n/a"


def test_failures_tell_packaging_from_device():
    missing = "Traceback ...\nModuleNotFoundError: No module named 'matplotlib'\n"
    assert gpu_check.failure(1, missing) == {"failure": "packaging", "missing_module": "matplotlib"}
    assert gpu_check.failure(1, "RuntimeError: CUDA error: an illegal memory access") == {"failure": "run"}
    assert gpu_check.failure("timeout", "stopped after 90 s") == {"failure": "timeout"}
