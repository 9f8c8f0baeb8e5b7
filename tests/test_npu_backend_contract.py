"""Contract tests of the NPU backend with a STAND-IN ``torch_npu`` (tests/standins/torch_npu), not the real one.

No Ascend hardware or CANN toolkit exists here. These tests check that the backend imports ``torch_npu`` lazily,
turns every import failure into an unavailable reason, and uses the NPU API and names (``torch.npu.*``,
``hccl``, ``ASCEND_RT_VISIBLE_DEVICES``). What ran on real Ascend hardware is listed in docs/backends.md.
"""

import os
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from accel_backends import BackendUnavailableError, DistributedSetupError
from accel_backends.backends.npu import NPUBackend
from accel_backends.registry import Registry

STANDINS = Path(__file__).parent / "standins"
LAUNCHER = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}


@pytest.fixture
def standin(monkeypatch):
    """Make ``import torch_npu`` find the stand-in; afterwards leave an unavailable ``torch.npu``.

    The stand-in renames torch's private-use device to "npu", which cannot be undone in this process; without a
    ``torch.npu`` module torch's own accelerator query (``torch.accelerator``, used by activation checkpointing)
    would then raise in every later test. An unavailable one makes it answer "no accelerator", as before.
    """
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.syspath_prepend(str(STANDINS))
    if hasattr(torch, "npu"):
        del torch.npu
    yield
    sys.modules.pop("torch_npu", None)
    torch.npu = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0,
                                      _is_in_bad_fork=lambda: False, manual_seed_all=lambda seed: None)
    torch.get_device_module.cache_clear()


@pytest.fixture
def fake_torch_npu(monkeypatch, tmp_path):
    """Write a ``torch_npu`` whose import fails the way a real one does without CANN."""

    def install(source):
        (tmp_path / "torch_npu.py").write_text(source)
        monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
        monkeypatch.syspath_prepend(str(tmp_path))

    yield install
    sys.modules.pop("torch_npu", None)


def test_registering_does_not_import_torch_npu(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    Registry(autoload=False).records()
    assert "torch_npu" not in sys.modules


def test_not_installed_says_so():
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch_npu is installed here")
    reason = NPUBackend().unavailable_reason()
    assert reason.startswith("torch_npu is not installed") and "CANN" in reason


def test_missing_cann_libraries_tell_the_user_to_install_cann(fake_torch_npu):
    fake_torch_npu('raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n')
    backend = NPUBackend()
    reason = backend.unavailable_reason()
    assert "torch_npu failed to import" in reason and "libhccl.so" in reason and "CANN toolkit" in reason
    assert not backend.is_available()
    with pytest.raises(BackendUnavailableError, match="libhccl.so"):
        backend.memory_stats()


def test_any_import_exception_becomes_a_reason(fake_torch_npu):
    fake_torch_npu('raise RuntimeError("SoC version not supported")\n')
    assert NPUBackend().unavailable_reason() == "torch_npu failed to import: RuntimeError: SoC version not supported"


def test_no_visible_device_names_the_visible_devices_variable(standin, monkeypatch):
    monkeypatch.setenv("STANDIN_NPU_COUNT", "0")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "")
    reason = NPUBackend().unavailable_reason()
    assert "no NPU is visible" in reason and "ASCEND_RT_VISIBLE_DEVICES=''" in reason


def test_uses_the_npu_device_module(standin, monkeypatch):
    # Even where torch.accelerator names the NPU, its memory API is not served by torch_npu's allocator.
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args: torch.device("npu"))
    backend = NPUBackend()
    assert backend.unavailable_reason() is None and backend.torch_accelerator() is None
    import torch_npu

    assert torch_npu.__version__.endswith("standin"), "these tests must never run against the real package"
    assert backend.device_count() == 2
    assert backend.device(1) == torch.device("npu", 1)
    stats = backend.memory_stats()
    assert (stats.allocated, stats.reserved, stats.peak_allocated) == (5 * 2**20, 8 * 2**20, 7 * 2**20)
    assert (stats.free, stats.total) == (60 * 2**30, 64 * 2**30)
    backend.reset_peak_memory_stats()
    assert backend.memory_stats().peak_allocated == 0
    backend.empty_cache()
    backend.synchronize()
    backend.manual_seed(7)
    called = {name for name, _ in torch_npu.CALLS}
    assert {"memory_allocated", "memory_reserved", "max_memory_allocated", "mem_get_info",
            "reset_peak_memory_stats", "empty_cache", "synchronize", "manual_seed_all"} <= called
    assert backend.describe()["torch_npu"] == "0.0.0-standin"


def test_conformance_rules_that_need_no_kernel_pass_on_the_stand_in(standin):
    from accel_backends.testing import run_conformance

    results = run_conformance(NPUBackend(), rules=("attributes", "availability"))
    assert [r.status for r in results] == ["passed", "passed"], results


def test_auto_detection_prefers_an_available_npu_over_cpu(standin):
    reg = Registry(autoload=False)
    if reg.get("cuda").backend.is_available():
        pytest.skip("a GPU outranks the NPU here")
    assert reg.select().name == "npu"


def test_init_distributed_uses_hccl_and_binds_the_local_npu(standin, monkeypatch):
    for key, value in LAUNCHER.items():
        monkeypatch.setenv(key, value)
    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    backend = NPUBackend()
    info = backend.init_distributed(timeout=60)
    import torch_npu

    assert (info.rank, info.world_size, info.local_rank) == (1, 2, 1)
    (kwargs,) = calls
    assert kwargs["backend"] == "hccl" and kwargs["init_method"] == "accel-env://"
    assert kwargs["device_id"] == torch.device("npu", 1)
    assert ("set_device", (1,)) in torch_npu.CALLS
    assert backend.metrics_device() == backend.fsdp_device_id() == torch.device("npu", 1)


def test_local_rank_beyond_visible_npus_is_explained(standin, monkeypatch):
    for key, value in {**LAUNCHER, "LOCAL_RANK": "5", "RANK": "5", "WORLD_SIZE": "8"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(DistributedSetupError, match=r"LOCAL_RANK=5 but only 2 npu.*ASCEND_RT_VISIBLE_DEVICES='0,1'"):
        NPUBackend().init_distributed()


def _torch_npu_metadata(directory, version, torch_requirement):
    """Installed-package metadata of a torch_npu ``version`` that requires ``torch_requirement``, as pip writes it."""
    info = directory / f"torch_npu-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch-npu\nVersion: {version}\n"
                                   f"Requires-Dist: {torch_requirement}\n")


THIS_TORCH = torch.__version__.split("+")[0]
OTHER_TORCH = "2.9.0" if THIS_TORCH != "2.9.0" else "2.8.0"


def test_torch_npu_built_for_another_torch_names_the_matching_release(fake_torch_npu, tmp_path):
    # What a mismatched torch_npu says by itself tells the user nothing.
    fake_torch_npu('raise RuntimeError("Two accelerators cannot be used at the same time")\n')
    _torch_npu_metadata(tmp_path, f"{OTHER_TORCH}.post4", f"torch=={OTHER_TORCH}")
    reason = NPUBackend().unavailable_reason()
    assert reason.startswith(f"torch_npu {OTHER_TORCH}.post4 is built for torch {OTHER_TORCH}, "
                             f"but torch {torch.__version__} is installed")
    assert f"pip install 'torch-npu=={THIS_TORCH}.*'" in reason and f"torch=={OTHER_TORCH}" in reason
    assert "Two accelerators cannot be used at the same time" in reason, "torch_npu's own error is kept"


def test_a_mismatch_is_reported_even_when_torch_npu_imports(standin, tmp_path, monkeypatch):
    _torch_npu_metadata(tmp_path, f"{OTHER_TORCH}.post4", f"torch=={OTHER_TORCH}.*")
    monkeypatch.syspath_prepend(str(tmp_path))
    reason = NPUBackend().unavailable_reason()
    assert reason.startswith(f"torch_npu {OTHER_TORCH}.post4 is built for torch {OTHER_TORCH}.*, but torch")


@pytest.mark.parametrize("requirement", [f"torch=={THIS_TORCH}", f"torch=={THIS_TORCH}.*"])
def test_torch_npu_built_for_this_torch_passes_the_version_check(standin, tmp_path, monkeypatch, requirement):
    _torch_npu_metadata(tmp_path, f"{THIS_TORCH}.post1", requirement)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert NPUBackend().unavailable_reason() is None


def test_info_npu_shows_cann_driver_socs_memory_and_the_hccl_ascend_variables(standin, monkeypatch):
    from accel_backends.cli import _info

    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "3600")
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", "/usr/local/Ascend/ascend-toolkit/latest")
    monkeypatch.setenv("ACCEL_BACKEND_UNRELATED", "x")
    versions = _info("npu")["versions"]
    assert versions["torch_npu"] == "0.0.0-standin" and versions["cann"] == "9.0.RC1"
    assert versions["driver"] == "25.2.0"
    assert versions["devices"] == [{"index": i, "soc": "Ascend910B (stand-in)", "memory_total_gib": 64.0,
                                    "memory_free_gib": 60.0} for i in range(2)]
    assert {"HCCL_CONNECT_TIMEOUT": "3600", "ASCEND_TOOLKIT_HOME": "/usr/local/Ascend/ascend-toolkit/latest"}.items() \
        <= versions["environment"].items()
    assert all(key.startswith(("HCCL_", "ASCEND_")) for key in versions["environment"])


def test_init_distributed_sets_hccl_timeouts_the_user_did_not_set_and_says_so_once(standin, monkeypatch, capsys):
    import accel_backends.base as base

    for key, value in LAUNCHER.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "7200")  # the user's choice stays
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "")
    monkeypatch.delenv("HCCL_CONNECT_TIMEOUT")  # restored to unset after the test
    monkeypatch.setattr(base, "_ANNOUNCED", {})
    seen = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: seen.append(
        {k: v for k, v in os.environ.items() if k.startswith("HCCL_")}))
    backend = NPUBackend()
    backend.init_distributed(timeout=60)
    backend.init_distributed(timeout=60)
    assert seen == [{"HCCL_CONNECT_TIMEOUT": "1800", "HCCL_EXEC_TIMEOUT": "7200"}] * 2
    assert capsys.readouterr().err.count("HCCL_CONNECT_TIMEOUT=1800") == 1
    assert backend.distributed_env_defaults(3600) == {"HCCL_CONNECT_TIMEOUT": "3600", "HCCL_EXEC_TIMEOUT": "3600"}
    from accel_backends.backends.cpu import CPUBackend

    assert CPUBackend().distributed_env_defaults(60) == {}
def test_attention_choice_is_the_ascend_flash_attention_when_torch_npu_works(standin, fake_torch_npu):
    # transformers calls its Ascend integration "flash_attention_2" and routes it to torch_npu's fused attention.
    assert NPUBackend().attention_implementation(packed=True) == "flash_attention_2"
    fake_torch_npu('raise ImportError("libhccl.so: cannot open shared object file")\n')
    assert NPUBackend().attention_implementation(packed=True) == "sdpa"


class _RecordingHCCL:
    """Stand-in for torch_npu's ``ProcessGroupHCCL`` (NOT HCCL): records how it was built."""

    built: list = []

    class Options:
        def __init__(self):
            self._timeout = None

    def __init__(self, store, rank, size, options_or_timeout):
        timeout = getattr(options_or_timeout, "_timeout", options_or_timeout)
        _RecordingHCCL.built.append((store, rank, size, timeout, type(options_or_timeout).__name__))


@pytest.mark.parametrize("options", [True, False], ids=["options", "older-timeout-only"])
def test_the_weight_group_for_vllm_servers_is_hccl_on_the_local_npu(standin, monkeypatch, options):
    import datetime

    import torch_npu

    group_class = type("ProcessGroupHCCL", (_RecordingHCCL,), {} if options else {"Options": None})
    monkeypatch.setattr(torch_npu, "_C", types.SimpleNamespace(
        _distributed_c10d=types.SimpleNamespace(ProcessGroupHCCL=group_class)), raising=False)
    _RecordingHCCL.built = []
    backend = NPUBackend()
    backend.set_device(1)
    store = dist.HashStore()
    made = backend.new_weight_group(store, 2, 3, 60.0)
    assert isinstance(made.group, _RecordingHCCL) and made.device == torch.device("npu", 1)
    assert _RecordingHCCL.built == [(store, 2, 3, datetime.timedelta(seconds=60),
                                     "Options" if options else "timedelta")]
    facts = backend.inference_engine_facts()
    assert facts.weight_transfer == "accel"  # this package's engine: vllm-ascend's hccl has no trainer half
