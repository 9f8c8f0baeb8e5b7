"""Huawei Ascend NPUs through ``torch_npu`` and HCCL.

``torch_npu`` is imported only when this backend is probed or used, never when it is registered: without
Ascend's CANN toolkit the import fails (``libhccl.so`` and friends are missing), and that failure must become an
unavailable reason, not a crash of every program that merely lists backends.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re

import torch

from ..base import DeviceBackend, InferenceEngineFacts, WeightGroup
from ..errors import BackendUnavailableError
from ..hookspecs import hookimpl

_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
_CANN_HINT = f"install Ascend's CANN toolkit matching torch_npu and load its environment (source {_SET_ENV})"
_DRIVER_VERSION_FILE = "/usr/local/Ascend/driver/version.info"
HCCL_MIN_TIMEOUT_S = 1800
# CANN takes HCCL_CONNECT_TIMEOUT in [120, 7200] s only (its environment-variable reference); outside, HCCL
# refuses the value at its first collective.
HCCL_CONNECT_TIMEOUT_RANGE_S = (120, 7200)
HCCL_REDUCE_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
                                torch.bfloat16})
_NOT_PROBED = object()


class NPUBackend(DeviceBackend):
    name = "npu"
    device_type = "npu"
    dist_backend = "hccl"
    priority = 90
    computes_on_host_threads = False  # kernels run on the NPU; host threads only launch them
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    supports_pinned_memory = True
    preferred_param_dtype = torch.bfloat16
    accelerator_api = False  # torch_npu's allocator does not implement torch.accelerator's memory API: torch.npu
    # ProcessGroupHCCL's checkSupportedDataType (torch_npu/csrc/distributed/ProcessGroupHCCL.cpp): float64 reduces
    # only from Ascend950 on, so a float64 all-reduce raises on a 910B, even in a group of one.
    collective_reduce_dtypes = HCCL_REDUCE_DTYPES

    def __init__(self) -> None:
        self._import_failure = _NOT_PROBED  # None once torch_npu imported, else the reason it did not

    def _import_torch_npu(self) -> str | None:
        """Import ``torch_npu`` once; return why it failed, or ``None``."""
        if self._import_failure is _NOT_PROBED:
            self._import_failure = _describe_import_failure()
        return self._import_failure

    def device_module(self):
        failure = self._import_torch_npu()
        if failure is not None:
            raise BackendUnavailableError(f"backend 'npu' is not available here: {failure}")
        return torch.npu

    def unavailable_reason(self) -> str | None:
        failure = self._import_torch_npu()
        if failure is not None:
            return failure
        return self.no_visible_device(torch.npu, "torch_npu imported but no NPU is visible",
                                      ": check the driver with npu-smi info and the visible-devices variable",
                                      label="the NPU")

    def attention_implementation(self, packed: bool = True) -> str:
        """transformers' Ascend flash-attention integration when ``torch_npu`` works (transformers calls it
        ``flash_attention_2`` and routes it to ``torch_npu``'s fused attention on an NPU), else ``sdpa``."""
        return "flash_attention_2" if self._import_torch_npu() is None else "sdpa"

    def peak_flops(self, dtype: torch.dtype) -> float | None:
        """The current NPU's dense fp16/bf16 peak, by its SoC name (``npu_peak_flops``); ``None`` elsewhere."""
        if not self.is_available():
            return None
        return npu_peak_flops(torch.npu.get_device_name(self.current_index()), dtype)

    def describe(self) -> dict:
        """torch and torch_npu, CANN and driver versions, each device's SoC name and memory, and the ``HCCL_*`` /
        ``ASCEND_*`` variables set (whether CANN's set_env.sh was sourced shows there)."""
        info: dict = {"torch": torch.__version__}
        if self._import_torch_npu() is None:
            info["torch_npu"] = getattr(importlib.import_module("torch_npu"), "__version__", "unknown")
            info["cann"] = _cann_version("CANN") or getattr(torch.version, "cann", None)
            info["driver"] = _cann_version("DRIVER") or _driver_version_file()
            if self.is_available():
                info["devices"] = [_device_row(i) for i in range(self.device_count())]
        info["environment"] = {key: value for key, value in sorted(os.environ.items())
                               if key.startswith(("HCCL_", "ASCEND_"))}
        return info

    def explain_autoload_failure(self, failure: dict) -> str | None:
        names = " ".join(str(failure.get(key) or "") for key in ("extension", "entry_point", "distribution"))
        if "torch_npu" not in names and "torch-npu" not in names:
            return None
        mismatch = _version_mismatch()
        if mismatch is not None:
            return mismatch
        return (f"load CANN's environment in this shell before starting Python: source "
                f"{_SET_ENV} (or install the CANN toolkit that matches torch_npu if it is missing); "
                f"otherwise reinstall torch_npu for this torch: {_matching_torch_npu()}")

    def inference_engine_facts(self) -> InferenceEngineFacts:
        """vllm-ascend (public reports; not run here): sleep level 1 is the one that works; its worker has no
        ``reload_weights``, so weights go through the model's ``load_weights``; pushing into sleeping memory
        crashes (the engine wakes its weights first); the NZ weight layout must be off for weights replaced in
        place (``VLLM_ASCEND_ENABLE_NZ=0``). Servers take weights through this package's engine over an HCCL
        weight group (``new_weight_group``): vllm-ascend's own ``hccl`` engine has a worker half only (its trainer
        side offers ``npu_ipc``, same-node), so it cannot be selected for servers. Neither ran on a 910B here."""
        return InferenceEngineFacts(package="vllm-ascend (pip install vllm-ascend matching torch_npu and CANN)",
                                    sleep_level=1, weight_reload="load_weights", memory_fraction=True,
                                    env={"VLLM_ASCEND_ENABLE_NZ": "0"})

    def new_weight_group(self, store, rank: int, world_size: int, timeout_s: float) -> WeightGroup:
        """torch_npu's ``ProcessGroupHCCL`` on this process's NPU. Its constructor takes options (with the timeout)
        in recent torch_npu releases and the timeout itself in older ones. HCCL broadcasts uint8 and int64, all
        the wire sends, on its own stream after the caller's current one."""
        import datetime

        import torch_npu

        group_class = torch_npu._C._distributed_c10d.ProcessGroupHCCL
        timeout = datetime.timedelta(seconds=timeout_s)
        options_class = getattr(group_class, "Options", None)
        if options_class is None:
            return WeightGroup(group_class(store, rank, world_size, timeout), self.device())
        options = options_class()
        options._timeout = timeout
        return WeightGroup(group_class(store, rank, world_size, options), self.device())

    def distributed_env_defaults(self, timeout_s: float) -> dict[str, str]:
        """HCCL's connect and execution timeouts of at least 1800 s (Ascend's advice for FSDP), or the group's
        timeout if longer: HCCL's own defaults are shorter than a slow rank-0 load or a long generation. The
        connect timeout is kept within CANN's range (``hccl_connect_timeout``)."""
        seconds = int(max(HCCL_MIN_TIMEOUT_S, timeout_s))
        return {"HCCL_CONNECT_TIMEOUT": str(hccl_connect_timeout(seconds)), "HCCL_EXEC_TIMEOUT": str(seconds)}


def hccl_connect_timeout(seconds: float) -> int:
    """``seconds`` as a value CANN takes for ``HCCL_CONNECT_TIMEOUT``: whole seconds within
    ``HCCL_CONNECT_TIMEOUT_RANGE_S`` (a longer group timeout still waits that long in the execution timeout)."""
    low, high = HCCL_CONNECT_TIMEOUT_RANGE_S
    return min(max(int(seconds), low), high)


def _cann_version(module: str) -> str | None:
    """torch_npu's report of a CANN component's version (``"CANN"``, ``"DRIVER"``...; CANN 8.1 and later)."""
    utils = getattr(torch.npu, "utils", None)
    try:
        return getattr(utils, "get_cann_version", lambda module: None)(module=module) or None
    except Exception:  # noqa: BLE001 - diagnostics report, never crash
        return None


def _driver_version_file() -> str | None:
    """The driver's version from its install record (``Version=24.1.rc2``), where the driver is installed."""
    try:
        with open(_DRIVER_VERSION_FILE) as handle:
            for line in handle:
                if line.startswith("Version="):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def _device_row(index: int) -> dict:
    """One NPU: its SoC name and memory (GiB)."""
    row: dict = {"index": index, "soc": torch.npu.get_device_name(index)}
    try:
        free, total = torch.npu.mem_get_info(index)
        row.update(memory_total_gib=round(total / 2**30, 1), memory_free_gib=round(free / 2**30, 1))
    except Exception as exc:  # noqa: BLE001
        row["memory"] = f"{type(exc).__name__}: {exc}"
    return row


def _torch_release() -> str:
    """This torch's release, without a local build tag (``2.10.0+cu128`` -> ``2.10.0``)."""
    return torch.__version__.split("+")[0]


def _matching_torch_npu() -> str:
    """What to install for this torch: torch_npu releases carry their torch's version (``2.10.0.post7``)."""
    return f"pip install 'torch-npu=={_torch_release()}.*'"


def _torch_npu_pin() -> tuple[str, str] | None:
    """(installed torch_npu version, the exact torch it requires), from its metadata; ``None`` if unknown."""
    try:
        dist = importlib.metadata.distribution("torch-npu")
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in dist.requires or ():
        match = re.match(r"torch\s*\(?\s*==\s*([0-9][^\s,;)]*)", requirement)
        if match:
            return dist.version, match[1]
    return None


def _version_mismatch() -> str | None:
    """Why the installed torch_npu does not fit this torch (each torch_npu pins one exact torch), or ``None``."""
    pin = _torch_npu_pin()
    if pin is None:
        return None
    npu_version, wanted = pin
    release, wanted_release = _torch_release(), wanted.removesuffix(".*").split("+")[0]
    if release == wanted_release or (wanted.endswith(".*") and release.startswith(wanted_release + ".")):
        return None
    return (f"torch_npu {npu_version} is built for torch {wanted}, but torch {torch.__version__} is installed: "
            f"{_matching_torch_npu()} to match this torch (or install torch=={wanted_release})")


def _describe_import_failure() -> str | None:
    mismatch = _version_mismatch()  # a torch_npu built for another torch fails to import with unhelpful messages
    failure = None
    try:
        importlib.import_module("torch_npu")
    except ModuleNotFoundError as exc:
        if exc.name == "torch_npu" and mismatch is None:
            return (
                f"torch_npu is not installed: {_matching_torch_npu()} "
                f"(the extra accel-backends[npu]) and {_CANN_HINT}"
            )
        failure = f"torch_npu failed to import: {exc}"
    except (ImportError, OSError) as exc:
        failure = f"torch_npu failed to import: {exc}: {_CANN_HINT}"
    except Exception as exc:  # noqa: BLE001 - vendor packages raise all sorts of things at import
        failure = f"torch_npu failed to import: {type(exc).__name__}: {exc}"
    else:
        if not hasattr(torch, "npu"):
            failure = "torch_npu imported but did not register torch.npu: reinstall torch_npu matching this torch"
    if mismatch is not None:
        return mismatch + (f" ({failure})" if failure else "")
    return failure


# The 910B family's (Atlas A2; SoC names "Ascend910B1".."Ascend910B4") fp16/bf16 cube peak. Not sure: Huawei
# publishes no per-variant datasheet we could read, the variants differ (fewer AI cores or lower clocks on B3/B4),
# and 354 TFLOPS is the one figure other RL frameworks use for the whole family (a public 910B bf16 GEMM benchmark
# measured 328). An MFU on a B3/B4 may therefore read low. fp32 and other SoCs: not known, so no MFU.
NPU_910B_PEAK_FLOPS = 354e12


def npu_peak_flops(soc_name: str, dtype: torch.dtype) -> float | None:
    """An Ascend NPU's dense peak for ``dtype`` by its SoC name (``torch.npu.get_device_name``); ``None`` if unknown."""
    if "910B" in soc_name.upper() and dtype in (torch.bfloat16, torch.float16):
        return NPU_910B_PEAK_FLOPS
    return None


@hookimpl
def register_backends(register):
    register(NPUBackend())
