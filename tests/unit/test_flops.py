"""A transformer's FLOPs from its geometry (engine/runtime/flops.py) against figures computed by hand, the MFU and
``perf/*`` figures they give, and each backend's ``peak_flops`` (device names faked: no GPU or NPU here)."""

import types

import pytest
import torch

from accel_backends.backends import cpu, cuda, npu
from engine.rl.step_metrics import phase_flops
from engine.runtime.flops import Geometry, mfu, perf_metrics

# Qwen2.5-0.5B's config.json: 24 layers, hidden 896, 14 heads of 64, 2 KV heads, intermediate 4864, vocab 151936.
QWEN_05B = types.SimpleNamespace(num_hidden_layers=24, hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                                 intermediate_size=4864, vocab_size=151936)


def test_qwen25_05b_forward_flops_equal_the_hand_computed_figure():
    geometry = Geometry.of(QWEN_05B)
    assert geometry == Geometry(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64,
                                vocab=151936)
    # Per token and layer: q and o 2 x 2 x 896 x 896 = 3,211,264; k and v 2 x 2 x 896 x 128 = 458,752;
    # MLP 3 x 2 x 896 x 4864 = 26,148,864; sum 29,818,880; x 24 layers = 715,653,120; LM head 2 x 896 x 151936 =
    # 272,269,312; in all 987,922,432 per token.
    assert geometry.dense_per_token() == 987_922_432
    # Causal attention over 1024 tokens: 24 layers x 4 x 14 heads x 64 x (1024 x 1025 / 2) = 45,141,196,800.
    assert geometry.attention_per_sequence(1024) == 45_141_196_800
    # Two sequences (1024 and 1): 1025 tokens' dense FLOPs and each one's attention.
    expected = 987_922_432 * 1025 + 45_141_196_800 + 24 * 4 * 14 * 64 * 1
    assert geometry.forward_flops([1024, 1]) == float(expected)


def test_a_config_without_the_shape_gives_no_geometry():
    assert Geometry.of(types.SimpleNamespace(hidden_size=64)) is None
    assert Geometry.of(None) is None


def test_step_phases_count_forward_once_and_the_update_three_times_per_epoch():
    geometry = Geometry.of(QWEN_05B)
    forward = geometry.forward_flops([100, 200])
    flops = phase_flops(geometry, {"ref": geometry, "teacher": None}, [100, 200], epochs=2, old_pass=True)
    assert flops == {"rollout": forward, "update": 6 * forward, "old_log_probs": forward, "ref_log_probs": forward}
    assert "old_log_probs" not in phase_flops(geometry, {}, [100], epochs=1, old_pass=False)
    assert phase_flops(None, {}, [100], epochs=1, old_pass=True) == {}


def test_mfu_is_flops_over_seconds_devices_and_peak_and_none_without_a_peak():
    assert mfu(4e12, 2.0, 2, 10e12) == pytest.approx(0.1)
    assert mfu(4e12, 2.0, 2, None) is None
    row = perf_metrics({"update": 6e12, "rollout": 1e12, "old_log_probs": 1e12}, {"update": 3.0, "rollout": 0.5},
                       2, 2e12)
    assert row == pytest.approx({"perf/tflops/update": 1.0, "perf/mfu/update": 0.5, "perf/mfu": 0.5,
                                 "perf/tflops/rollout": 1.0, "perf/mfu/rollout": 0.5})  # old: not timed
    unknown = perf_metrics({"update": 6e12}, {"update": 3.0}, 2, None)
    assert unknown == {"perf/tflops/update": 1.0}


@pytest.mark.parametrize(("name", "dtype", "peak"), [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989e12), ("NVIDIA H200", torch.bfloat16, 989e12),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756e12), ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312e12),
    ("NVIDIA H100 80GB HBM3", torch.float32, 67e12), ("NVIDIA A100-PCIE-40GB", torch.float32, 19.5e12),
    ("NVIDIA GeForce RTX 4090", torch.bfloat16, None), ("NVIDIA H100 80GB HBM3", torch.float64, None)])
def test_cuda_peak_comes_from_the_device_name(monkeypatch, name, dtype, peak):
    backend = cuda.CUDABackend()
    monkeypatch.setattr(cuda.CUDABackend, "is_available", lambda self: True)
    monkeypatch.setattr(cuda.CUDABackend, "current_index", lambda self: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    assert backend.peak_flops(dtype) == peak


@pytest.mark.parametrize(("name", "dtype", "peak"), [
    ("Ascend910B2", torch.bfloat16, npu.NPU_910B_PEAK_FLOPS), ("Ascend910B4", torch.float16, npu.NPU_910B_PEAK_FLOPS),
    ("Ascend910B2", torch.float32, None), ("Ascend310P3", torch.bfloat16, None)])
def test_npu_peak_comes_from_the_soc_name(monkeypatch, name, dtype, peak):
    backend = npu.NPUBackend()
    monkeypatch.setattr(npu.NPUBackend, "is_available", lambda self: True)
    monkeypatch.setattr(npu.NPUBackend, "current_index", lambda self: 0)
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(get_device_name=lambda index=None: name), raising=False)
    assert backend.peak_flops(dtype) == peak


def test_no_device_means_no_peak():
    assert cuda.CUDABackend().peak_flops(torch.bfloat16) is None  # torch here is a CPU build


def test_cpu_peak_is_measured_once_per_process(monkeypatch):
    calls = []

    def probe(dtype):
        calls.append(dtype)
        return 5e10

    monkeypatch.setattr(cpu, "_MEASURED", {})
    monkeypatch.setattr(cpu, "gemm_probe_flops", probe)
    backend = cpu.CPUBackend()
    assert backend.peak_flops(torch.float32) == 5e10 and cpu.CPUBackend().peak_flops(torch.float32) == 5e10
    assert calls == [torch.float32]


def test_the_gemm_probe_measures_a_positive_rate_within_its_budget():
    assert cpu.gemm_probe_flops(torch.float32, size=64, budget_s=0.01) > 0.0
