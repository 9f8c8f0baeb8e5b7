"""NVIDIA GPUs through ``torch.cuda`` and NCCL; ROCm builds of torch use the same API and say so.

Devices, memory and synchronisation come from ``torch.accelerator`` (the ``DeviceBackend`` defaults); this class
keeps only what is CUDA's own: the names, why it cannot run where it cannot, and what ``describe()`` adds.
"""

from __future__ import annotations

import importlib
import re
import subprocess

import torch

from ..base import DeviceBackend, InferenceEngineFacts, WeightGroup
from ..hookspecs import hookimpl


class CUDABackend(DeviceBackend):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"  # on ROCm builds torch maps this name to RCCL
    priority = 100
    computes_on_host_threads = False  # kernels run on the GPU; host threads only launch them
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    supports_pinned_memory = True
    preferred_param_dtype = torch.bfloat16
    collective_reduce_dtypes = None  # NCCL (and RCCL) reduce every dtype torch has, float64 included

    def inference_engine_facts(self) -> InferenceEngineFacts:
        """vLLM on NVIDIA/ROCm GPUs: sleep level 1 (weights to host memory, KV cache dropped) during the update;
        weights replaced through the worker's ``reload_weights``; memory by ``gpu_memory_utilization``; servers take
        weights through this package's engine over an NCCL weight group (``new_weight_group``; vLLM's own ``nccl``
        engine stays selectable). Not run on a GPU here: these follow vLLM's documentation."""
        return InferenceEngineFacts(package="vllm (pip install vllm: it pins its own torch)", sleep_level=1,
                                    weight_reload="reload_weights", memory_fraction=True)

    def new_weight_group(self, store, rank: int, world_size: int, timeout_s: float) -> WeightGroup:
        """An NCCL group on this process's GPU (its communicator is made at the first broadcast, by every member
        at once). NCCL runs each collective on its own stream after the caller's current stream and makes the
        caller's stream wait on the work: the tensors stay ordered with the stream that produced them."""
        import datetime

        from torch.distributed import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = datetime.timedelta(seconds=timeout_s)
        return WeightGroup(ProcessGroupNCCL(store, rank, world_size, options), self.device())

    @staticmethod
    def platform() -> str:
        """``"CUDA 12.8"``, ``"ROCm (HIP 6.4)"``, or ``"none"`` for a CPU-only build of torch."""
        if getattr(torch.version, "hip", None):
            return f"ROCm (HIP {torch.version.hip})"
        if torch.version.cuda:
            return f"CUDA {torch.version.cuda}"
        return "none"

    def unavailable_reason(self) -> str | None:
        if self.platform() == "none":
            return (
                f"this torch ({torch.__version__}) was built without CUDA or ROCm: "
                "install a CUDA build of torch to use NVIDIA GPUs"
            )
        return self.no_visible_device(torch.cuda, f"torch is built for {self.platform()} but no GPU is visible",
                                      ": check the driver (nvidia-smi or rocm-smi) and the visible-devices variable",
                                      label="CUDA")

    def attention_implementation(self, packed: bool = True) -> str:
        """``flash_attention_2`` when the ``flash_attn`` package imports (variable-length kernels: packed input costs
        no mask), else ``sdpa``."""
        return "flash_attention_2" if _flash_attn_importable() else "sdpa"

    def peak_flops(self, dtype: torch.dtype) -> float | None:
        """The current GPU's dense peak from NVIDIA's datasheets, by its name (``None`` for a GPU not listed)."""
        if not self.is_available():
            return None
        return gpu_peak_flops(torch.cuda.get_device_name(self.current_index()), dtype)

    def describe(self) -> dict:
        """torch, the CUDA (or HIP) version it was built with, the driver and NCCL (RCCL) versions, the GPUs."""
        info = {**super().describe(), "platform": self.platform(), "driver": _driver_version()}
        if self.platform() != "none":
            info["nccl"] = _nccl_version()
        if self.is_available():
            info["bf16"] = torch.cuda.is_bf16_supported()
        return info


# Dense (no 2:4 sparsity) peak FLOP/s by name fragment, from NVIDIA's datasheets: (bf16/fp16 tensor cores, fp32).
# fp32 is the plain FP32 rate (torch computes fp32 matmuls without TF32 unless allowed). The first fragment found in
# the device name wins, so the specific ones come first ("H100 PCIe" before "H100").
_GPU_PEAKS = (
    ("H100 NVL", 835e12, 60e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989e12, 67e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", 989e12, 67e12),  # SXM and NVL share the H100 SXM's compute
    ("H800", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("A800", 312e12, 19.5e12),
)


def gpu_peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """A GPU's dense peak for ``dtype`` by its name (``torch.cuda.get_device_name``); ``None`` when not listed."""
    for fragment, half, single in _GPU_PEAKS:
        if fragment.lower() in device_name.lower():
            if dtype in (torch.bfloat16, torch.float16):
                return half
            return single if dtype == torch.float32 else None
    return None


def driver_from_proc(text: str) -> str | None:
    """The version in ``/proc/driver/nvidia/version`` (``NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15
    ...``, or ``... Open Kernel Module for x86_64  570.86.15 ...``)."""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]*)", text)
    return match[1] if match else None


def _driver_version() -> str | None:
    """The NVIDIA kernel driver's version (from /proc, else ``nvidia-smi``); ``None`` where there is none."""
    try:
        with open("/proc/driver/nvidia/version") as handle:
            found = driver_from_proc(handle.read())
        if found:
            return found
    except OSError:
        pass
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20, check=True)
        return result.stdout.splitlines()[0].strip() or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a build without NCCL
        return None
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def _flash_attn_importable() -> bool:
    try:
        importlib.import_module("flash_attn")
    except Exception:  # noqa: BLE001 - a broken build (wrong CUDA or torch ABI) counts as absent
        return False
    return True


@hookimpl
def register_backends(register):
    register(CUDABackend())
