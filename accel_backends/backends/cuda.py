"""NVIDIA GPUs through ``torch.cuda`` and NCCL; ROCm builds of torch use the same API and say so.

Devices, memory and synchronisation come from ``torch.accelerator`` (the ``DeviceBackend`` defaults); this class
keeps only what is CUDA's own: the names, why it cannot run where it cannot, and what ``describe()`` adds.
"""

from __future__ import annotations

import importlib

import torch

from ..base import DeviceBackend
from ..hookspecs import hookimpl


class CUDABackend(DeviceBackend):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"  # on ROCm builds torch maps this name to RCCL
    priority = 100
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    supports_pinned_memory = True
    preferred_param_dtype = torch.bfloat16

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

    def describe(self) -> dict:
        info = {**super().describe(), "platform": self.platform()}
        if self.is_available():
            info["bf16"] = torch.cuda.is_bf16_supported()
        return info


def _flash_attn_importable() -> bool:
    try:
        importlib.import_module("flash_attn")
    except Exception:  # noqa: BLE001 - a broken build (wrong CUDA or torch ABI) counts as absent
        return False
    return True


@hookimpl
def register_backends(register):
    register(CUDABackend())
