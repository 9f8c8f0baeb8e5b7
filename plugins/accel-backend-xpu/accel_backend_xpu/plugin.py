"""Intel GPUs through ``torch.xpu`` (in torch itself since 2.4) and oneCCL's ``xccl`` process group (torch 2.8+).

``torch.xpu`` has the same shape as ``torch.cuda`` (device count, memory statistics, RNG, streams), so the
``DeviceBackend`` defaults serve almost everything; this class says which names to use and explains, in one
sentence, why the backend cannot run on a machine where it cannot.
"""

from __future__ import annotations

import torch

import accel_backends


class XPUBackend(accel_backends.DeviceBackend):
    name = "xpu"
    device_type = "xpu"
    dist_backend = "xccl"
    priority = 80  # below cuda (100) and npu (90): a machine with both picks the vendor it was set up for
    visible_devices_env = "ZE_AFFINITY_MASK"  # Level Zero's device mask
    supports_pinned_memory = True
    preferred_param_dtype = torch.bfloat16

    def device_module(self):
        return torch.xpu

    def unavailable_reason(self) -> str | None:
        xpu = getattr(torch, "xpu", None)
        if xpu is None:
            return f"this torch ({torch.__version__}) has no torch.xpu module: install torch 2.4 or newer built for XPU"
        try:
            if not xpu._is_compiled():
                return (f"this torch ({torch.__version__}) was built without XPU support: install an XPU build, "
                        "e.g. pip install torch --index-url https://download.pytorch.org/whl/xpu")
            if not xpu.is_available() or xpu.device_count() == 0:
                return (f"torch is built for XPU but no Intel GPU is visible{self._visible_devices_hint()}: check "
                        "the GPU driver and Level Zero runtime (xpu-smi discovery, sycl-ls)")
        except Exception as exc:  # noqa: BLE001 - a broken driver is a reason, not a crash
            return f"probing XPU failed: {type(exc).__name__}: {exc}"
        if not _xccl_available():
            return (f"this torch ({torch.__version__}) sees an Intel GPU but has no 'xccl' process group: use "
                    "torch 2.8 or newer built for XPU")
        return None

    def describe(self) -> dict:
        info = {"torch": torch.__version__, "xpu": getattr(torch.version, "xpu", None), "xccl": _xccl_available()}
        if self.is_available():
            info["devices"] = [torch.xpu.get_device_name(i) for i in range(torch.xpu.device_count())]
        return info


def _xccl_available() -> bool:
    import torch.distributed as dist

    probe = getattr(dist, "is_xccl_available", None)
    return bool(probe and probe())


@accel_backends.hookimpl
def register_backends(register):
    register(XPUBackend())
