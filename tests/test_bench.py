"""accel-bench: one tiny run of every scenario (2 CPU processes) checked by what it counts, and bad input."""

import importlib.util
import json

import pytest
from conftest import run_python, without_module

from engine.bench.cli import main

TINY = ["--steps", "1", "--switches", "1", "--switch-layers", "2,3", "--micro-batch-counts", "1,4",
        "--rollout-tokens", "2,4", "--rollout-batch", "2", "--grpo-steps", "1",
        "--grpo-override", "train.prompts_per_step=4", "--grpo-override", "rollout.n=4",
        "--grpo-override", "train.prompts_per_update=4", "--grpo-override", "train.micro_batch_size=4",
        "--packing-budgets", "16,128", "--sp-tokens", "64", "--sp-repeats", "1"]


@pytest.mark.slow
def test_every_scenario_runs_and_counts_its_collectives(tmp_path):
    """Without matplotlib (as on ci/gpu-check.sh's GPU image): --plot notes it in one line, the run succeeds, and
    the plot draws from the JSON where matplotlib is installed."""
    from engine.bench.plot import plot_grad_accum

    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    hidden = without_module(tmp_path / "no-matplotlib", "matplotlib")
    result = run_python(["-m", "engine.bench", *TINY, "--json", str(out), "--plot", str(png)],
                        env={"ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": hidden}, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "== GRPO step" in result.stdout and "engine / hand-written" in result.stdout
    assert result.stderr.count("plot not drawn: matplotlib is not installed") == 1 and not png.exists()
    data = json.loads(out.read_text())
    scenarios = data["scenarios"]
    assert set(scenarios) == {"mode_switch", "grad_accum", "overhead", "rollout", "grpo", "packing", "sft",
                              "sequence_parallel"}
    assert plot_grad_accum(data, png) and png.read_bytes()[:4] == b"\x89PNG"

    switch = scenarios["mode_switch"]
    for layers in (2, 3):
        calls = switch[f"layers_{layers}"]["fast_path_calls"]
        assert calls["gc_collect"] == 0 and calls["empty_cache"] == 0 and calls["switches"] > 0
    offload = switch["offload"]
    assert [offload[k]["moves_per_enter"] for k in ("param_offload", "optimizer_offload", "both")] == [1, 1, 2]
    assert offload["both"]["bytes_per_round_trip"] == (offload["param_offload"]["bytes_per_round_trip"]
                                                       + offload["optimizer_offload"]["bytes_per_round_trip"]) > 0
    onload = switch["optimizer_onload"]
    assert onload["step"]["moves_per_step"] == onload["mode"]["moves_per_step"] == 2, onload
    assert onload["mode"]["residency_during_forward_backward"]["optimizer"] == "device"
    assert onload["step"]["residency_during_forward_backward"]["optimizer"] == "cpu"

    accum = scenarios["grad_accum"]
    for version, modes in (("fsdp1", {"every_micro_batch", "deferred"}),
                           ("fsdp2", {"every_micro_batch", "deferred", "deferred_unsharded"})):
        units = accum[version]["sharded_units"]
        rows = accum[version]["micro_batches"]["4"]
        assert set(rows) == modes
        assert rows["every_micro_batch"]["collectives"]["reduce_scatter"] == 4 * units
        assert rows["deferred"]["collectives"]["reduce_scatter"] == units
        assert all(row["collectives"]["bytes"] > 0 and row["median_ms"] > 0 for row in rows.values())
        single = accum[version]["micro_batches"]["1"]
        assert {row["collectives"]["reduce_scatter"] for row in single.values()} == {units}
    fsdp2 = accum["fsdp2"]["micro_batches"]["4"]
    assert fsdp2["deferred_unsharded"]["collectives"]["reduce_scatter"] == accum["fsdp2"]["sharded_units"]
    assert fsdp2["deferred_unsharded"]["collectives"]["all_gather"] < fsdp2["deferred"]["collectives"]["all_gather"]
    assert fsdp2["deferred"]["collectives"]["bytes"] < fsdp2["every_micro_batch"]["collectives"]["bytes"]
    assert accum["decision"]["grad_sync_mode"] == accum["decision"]["grad_sync_plan"]["mode"] == "deferred"

    assert scenarios["overhead"]["engine_over_hand_written"] > 0
    rollout = scenarios["rollout"]
    for tokens in (2, 4):
        row = rollout[f"new_tokens_{tokens}"]
        assert row["all_gathers_per_call"] >= rollout["sharded_units"] and row["tokens_per_s_per_rank"] > 0
    grpo = scenarios["grpo"]
    assert grpo["calls_per_step"]["rollout"] == 1 and grpo["calls_per_step"]["update"] == 1
    assert grpo["calls_per_step"]["ref_log_probs"] == 1  # cpu-demo has a KL reference model
    assert set(grpo["parts"]) == {"rollout", "old_log_probs", "ref_log_probs", "update", "other"}
    assert 0.0 < grpo["perf"]["perf/mfu"] == grpo["perf"]["perf/mfu/update"] < 1.0  # the CPU's peak: a GEMM probe
    assert grpo["perf"]["perf/mfu/ref_log_probs"] > 0.0 and "perf/mfu/old_log_probs" not in grpo["perf"]
    packing = scenarios["packing"]  # 16 sequences over 2 ranks, 4 per micro-batch: 2 micro-batches per rank
    assert packing["micro_batches_per_rank"] == {"packed": 2, "padded": 2, "rollout": 2}
    pads = packing["pad_tokens_per_update"]
    assert pads["packed"] == 0 and 0 < pads["rollout"] and pads["padded"] < pads["rollout"], pads  # none packed; the
    # planner's padded micro-batches (similar lengths together) pad less than the rollout's own layout
    assert set(packing["update"]) == {"packed", "padded", "rollout"} and packing["packed_over_padded"] > 0
    assert packing["peak_by_budget"]["128"]["micro_batches_per_rank"] == 1  # at most 144 tokens over 2 ranks
    sft = scenarios["sft"]  # 32 sequences over 2 ranks, 2 per micro-batch: 8 micro-batches per rank
    variants = sft["variants"]
    assert all(0.0 < row["mfu"] < 1.0 for row in variants.values())
    assert {row["micro_batches_per_rank"] for row in variants.values()} == {8}
    tokens = {row["supervised_tokens"] for row in variants.values()}
    assert len(tokens) == 1 and tokens.pop() > 0  # the same supervised tokens whichever layout and sync
    assert variants["padded_deferred"]["pad_tokens_this_rank"] > 0
    assert variants["packed_deferred"]["pad_tokens_this_rank"] == 0
    assert sft["peak_by_budget"]["16"]["skipped"].startswith("below the longest sequence")
    assert sft["peak_by_budget"]["128"]["activation_mib"] > 0
    split = scenarios["sequence_parallel"]["tokens"]["64"]  # 2 layers: 4 exchanges each way per layer
    assert split["sp1"]["exchanges"] == 0 and split["sp2"]["exchanges"] == 2 * 4 * 2
    assert 0 < split["sp2"]["activation_mib"] < split["sp1"]["activation_mib"] and split["sp2"]["exchange_mib"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    (["--micro-batch-counts", "1,x"], "expected a positive whole number, got 'x'"),
    (["--scenarios", "warp"], "unknown scenario(s) warp"),
    (["--scenarios", "overhead", "--plot", "x.png"], "--plot draws the grad_accum scenario"),
    (["--grpo-override", "train.stepz=3"], "did you mean train.steps?"),
    (["--grpo-override", "train.mini_batch_size=7"], "train.mini_batch_size=7 does not divide"),
    (["--scenarios", "scaling", "--grpo-override", "train.prompts_per_step=3"],
     "scaling on 2 rank(s): train.prompts_per_step=3 does not divide"),
    (["--rollout-model", "/nonexistent"], "--rollout-model /nonexistent is not a model directory (no config.json)"),
    (["--scenarios", "weight_sync", "--weight-sync-dtypes", "bf16,fp8"], "dtypes are bf16 and fp32, got 'bf16,fp8'"),
    (["--scenarios", "weight_sync", "--weight-sync-lrs", "1e-5,3"],
     "learning rates are numbers in (0, 1), comma-separated, got '1e-5,3'"),
    pytest.param(["--scenarios", "vllm_alone"], "the vllm_alone scenario needs vLLM in this Python",
                 marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")),
])
def test_bad_input_is_refused_before_any_worker_starts(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
