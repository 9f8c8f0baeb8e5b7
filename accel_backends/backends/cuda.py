"""NVIDIA GPUs through ``torch.cuda`` and NCCL; ROCm builds of torch use the same API and say so."""

from __future__ import annotations

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

    def device_module(self):
        return torch.cuda

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
        try:
            if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
                return (
                    f"torch is built for {self.platform()} but no GPU is visible{self._visible_devices_hint()}: "
                    "check the driver (nvidia-smi or rocm-smi) and the visible-devices variable"
                )
        except Exception as exc:  # noqa: BLE001 - a broken driver is a reason, not a crash
            return f"probing CUDA failed: {type(exc).__name__}: {exc}"
        return None

    def describe(self) -> dict:
        info = {"torch": torch.__version__, "platform": self.platform()}
        if self.is_available():
            info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["bf16"] = torch.cuda.is_bf16_supported()
        return info


@hookimpl
def register_backends(register):
    register(CUDABackend())
