"""The CUDA backend: contract tests with a patched ``torch.cuda`` everywhere, real tests (marked ``cuda``) on a GPU.

The patched tests record which ``torch.cuda`` functions the backend calls; they do not prove anything runs on a
GPU. Tests marked ``cuda`` do, and are skipped where no GPU is usable.
"""

import pytest
import torch
import torch.distributed as dist

from accel_backends import DistributedSetupError
from accel_backends.backends.cuda import CUDABackend

LAUNCHER = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}


def recorder(calls: list):
    """``recorded(name, result)``: a stand-in function that appends ``(name, args)`` to ``calls`` and returns
    ``result`` (called with the arguments when it is callable)."""

    def recorded(name, result=None):
        def fn(*args, **kwargs):
            calls.append((name, args))
            return result(*args) if callable(result) else result

        return fn

    return recorded


@pytest.fixture
def patched_cuda(monkeypatch):
    """Pretend torch was built for CUDA 12.8 and sees two GPUs; record every call."""
    calls = []
    state = {"current": 0}
    recorded = recorder(calls)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    fakes = {
        "is_available": recorded("is_available", True),
        "device_count": recorded("device_count", 2),
        "current_device": recorded("current_device", lambda: state["current"]),
        "set_device": recorded("set_device", lambda i: state.update(current=i)),
        "synchronize": recorded("synchronize"),
        "memory_allocated": recorded("memory_allocated", 11),
        "memory_reserved": recorded("memory_reserved", 22),
        "max_memory_allocated": recorded("max_memory_allocated", 33),
        "mem_get_info": recorded("mem_get_info", (44, 80)),
        "reset_peak_memory_stats": recorded("reset_peak_memory_stats"),
        "empty_cache": recorded("empty_cache"),
        "manual_seed_all": recorded("manual_seed_all"),
        "get_device_name": recorded("get_device_name", lambda i: f"Stand-in GPU {i}"),
        "is_bf16_supported": recorded("is_bf16_supported", True),
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    # torch.accelerator does not name the device here (as on a CPU build), so the stand-in torch.cuda serves: a
    # CUDA build of torch on a machine without a driver would otherwise answer through the real one, and fail.
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args: None, raising=False)
    return calls


def test_cpu_only_torch_is_reported(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    reason = CUDABackend().unavailable_reason()
    assert "built without CUDA or ROCm" in reason and torch.__version__ in reason


def test_no_visible_gpu_names_the_variable(patched_cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    reason = CUDABackend().unavailable_reason()
    assert "CUDA 12.8" in reason and "CUDA_VISIBLE_DEVICES=''" in reason


def test_rocm_builds_are_reported_as_rocm(patched_cuda, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.4.1")
    backend = CUDABackend()
    assert backend.platform() == "ROCm (HIP 6.4.1)"
    assert backend.is_available() and backend.dist_backend == "nccl"


def test_uses_torch_cuda_for_memory_and_devices(patched_cuda):
    backend = CUDABackend()
    assert backend.unavailable_reason() is None and backend.device_count() == 2
    stats = backend.memory_stats()
    assert (stats.allocated, stats.reserved, stats.peak_allocated, stats.free, stats.total) == (11, 22, 33, 44, 80)
    backend.reset_peak_memory_stats()
    backend.empty_cache()
    backend.synchronize()
    names = [name for name, _ in patched_cuda]
    for expected in ("memory_allocated", "memory_reserved", "max_memory_allocated", "mem_get_info",
                     "reset_peak_memory_stats", "empty_cache", "synchronize"):
        assert expected in names


@pytest.fixture
def accelerator_stand_in(monkeypatch):
    """A labelled stand-in for ``torch.accelerator`` on a CUDA machine (this torch is a CPU build): it names
    ``cuda`` as the accelerator, answers with its own figures and records every call."""
    calls = []
    state = {"current": 0}
    recorded = recorder(calls)
    fakes = {
        "current_accelerator": lambda *args: torch.device("cuda"),
        "device_count": recorded("device_count", 3),
        "current_device_index": recorded("current_device_index", lambda: state["current"]),
        "set_device_index": recorded("set_device_index", lambda i: state.update(current=i)),
        "synchronize": recorded("synchronize"),
        "memory_allocated": recorded("memory_allocated", 101),
        "memory_reserved": recorded("memory_reserved", 202),
        "max_memory_allocated": recorded("max_memory_allocated", 303),
        "get_memory_info": recorded("get_memory_info", (404, 800)),
        "reset_peak_memory_stats": recorded("reset_peak_memory_stats"),
        "empty_cache": recorded("empty_cache"),
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(torch.accelerator, name, fake, raising=False)
    return calls


def test_torch_accelerator_serves_devices_and_memory_where_it_names_the_device(patched_cuda, accelerator_stand_in):
    backend = CUDABackend()
    assert backend.torch_accelerator() is torch.accelerator
    assert backend.device_count() == 3
    backend.set_device(2)
    assert backend.device() == torch.device("cuda", 2)
    stats = backend.memory_stats()
    assert (stats.allocated, stats.reserved, stats.peak_allocated, stats.free, stats.total) == (101, 202, 303, 404, 800)
    backend.reset_peak_memory_stats()
    backend.empty_cache()
    backend.synchronize()
    served = {name for name, _ in accelerator_stand_in}
    assert served == {"device_count", "current_device_index", "set_device_index", "synchronize", "memory_allocated",
                      "memory_reserved", "max_memory_allocated", "get_memory_info", "reset_peak_memory_stats",
                      "empty_cache"}
    from_cuda = {name for name, _ in patched_cuda} - {"is_available", "device_count"}  # the availability probe
    assert backend.describe()["devices"] == ["Stand-in GPU 0", "Stand-in GPU 1", "Stand-in GPU 2"]
    from_cuda -= {"get_device_name", "is_bf16_supported"}  # describe(): names are CUDA's own
    assert not from_cuda, f"torch.cuda served {from_cuda} although torch.accelerator could"


def test_older_torch_without_the_accelerator_memory_api_keeps_torch_cuda(patched_cuda, accelerator_stand_in,
                                                                          monkeypatch):
    monkeypatch.delattr(torch.accelerator, "memory_allocated")
    backend = CUDABackend()
    assert backend.torch_accelerator() is None
    assert backend.memory_stats().allocated == 11 and backend.device_count() == 2
    assert not accelerator_stand_in


def test_another_accelerator_leaves_the_device_module_in_charge(patched_cuda, accelerator_stand_in, monkeypatch):
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args: torch.device("xpu"))
    backend = CUDABackend()
    assert backend.torch_accelerator() is None and backend.memory_stats().peak_allocated == 33


def test_conformance_rules_that_need_no_kernel_pass_on_the_stand_ins(patched_cuda, accelerator_stand_in):
    """Only the rules that run no kernel can hold on a CPU build; the rest run for real on a GPU (ci/gpu-check.sh)."""
    from accel_backends.testing import run_conformance

    results = run_conformance(CUDABackend(), rules=("attributes", "availability"))
    assert [r.status for r in results] == ["passed", "passed"], results


def test_init_distributed_uses_nccl_and_binds_the_local_gpu(patched_cuda, monkeypatch):
    for key, value in LAUNCHER.items():
        monkeypatch.setenv(key, value)
    recorded = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: recorded.append(kwargs))
    backend = CUDABackend()
    info = backend.init_distributed(timeout=90)
    (kwargs,) = recorded
    assert (info.rank, info.world_size, info.local_rank) == (3, 4, 1)
    assert kwargs["backend"] == "nccl" and kwargs["device_id"] == torch.device("cuda", 1)
    assert kwargs["timeout"].total_seconds() == 90
    assert ("set_device", (1,)) in patched_cuda
    assert backend.metrics_device() == backend.fsdp_device_id() == torch.device("cuda", 1)


def test_local_rank_beyond_visible_gpus_is_explained(patched_cuda, monkeypatch):
    for key, value in {**LAUNCHER, "LOCAL_RANK": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(DistributedSetupError, match=r"LOCAL_RANK=2 but only 2 cuda.*CUDA_VISIBLE_DEVICES='0,1'"):
        CUDABackend().init_distributed()


def test_existing_group_of_another_backend_is_refused(patched_cuda, monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    with pytest.raises(DistributedSetupError, match="'gloo' process group is already initialised.*'nccl'"):
        CUDABackend().init_distributed()


# -- real GPU -----------------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_real_gpu_memory_and_pinned_moves():
    backend = CUDABackend()
    backend.set_device(0)
    backend.reset_peak_memory_stats()
    before = backend.memory_stats()
    tensor = backend.to_device(torch.randn(1024, 1024))
    during = backend.memory_stats()
    assert during.allocated - before.allocated >= 4 * 2**20
    assert during.peak_allocated >= during.allocated and during.total > during.free > 0
    host = backend.to_host(tensor, non_blocking=True)
    backend.synchronize()
    assert host.is_pinned() and torch.equal(host, tensor.cpu())


@pytest.mark.cuda
def test_real_gpu_single_process_nccl_group(monkeypatch):
    for var in LAUNCHER:
        monkeypatch.delenv(var, raising=False)
    backend = CUDABackend()
    try:
        info = backend.init_distributed(timeout=60)
        assert info.world_size == 1 and dist.get_backend() == "nccl"
        value = torch.ones(3, device=backend.metrics_device())
        dist.all_reduce(value)
        assert value.tolist() == [1.0, 1.0, 1.0]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_describe_reads_the_driver_version_as_the_kernel_module_reports_it():
    from accel_backends.backends.cuda import driver_from_proc

    assert driver_from_proc("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC "
                            "2024\nGCC version:  gcc version 12.2.0") == "550.54.15"
    assert driver_from_proc("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
                            "(dvs-builder@U16-I3-B03-4-3)") == "570.86.15"
    assert driver_from_proc("") is None


def test_info_cuda_shows_driver_cuda_and_nccl_versions(patched_cuda, monkeypatch):
    import accel_backends.backends.cuda as cuda

    monkeypatch.setattr(cuda, "_driver_version", lambda: "550.54.15")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 5))
    described = CUDABackend().describe()
    assert (described["platform"], described["driver"], described["nccl"]) == ("CUDA 12.8", "550.54.15", "2.27.5")
    assert described["devices"] == ["Stand-in GPU 0", "Stand-in GPU 1"]
def test_attention_choice_is_flash_attention_2_only_when_flash_attn_imports(monkeypatch, tmp_path):
    """STAND-IN flash_attn packages on the path: one that imports, one that fails as a mismatched build does."""
    import sys

    from accel_backends.backends.cpu import CPUBackend

    monkeypatch.setitem(sys.modules, "flash_attn", None)  # what Python does for a package that is not there
    assert CUDABackend().attention_implementation(packed=True) == "sdpa"
    monkeypatch.delitem(sys.modules, "flash_attn")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "flash_attn.py").write_text("raise ImportError('undefined symbol: _ZN3c10 (another torch)')\n")
    assert CUDABackend().attention_implementation(packed=True) == "sdpa"
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    (tmp_path / "flash_attn.py").write_text("__version__ = '0.0.0-standin'\n")
    assert CUDABackend().attention_implementation(packed=True) == "flash_attention_2"
    assert CUDABackend().attention_implementation(packed=False) == "flash_attention_2"
    assert CPUBackend().attention_implementation(packed=True) == "sdpa"  # the default every backend inherits
