"""Intel GPUs through ``torch.xpu`` (in torch itself since 2.4) and oneCCL's ``xccl`` process group (torch 2.8+).

Devices and memory come from ``torch.accelerator`` (torch runs XPU as its accelerator), RNG from ``torch.xpu``:
the ``DeviceBackend`` defaults serve everything, so this class says which names to use and explains, in one
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

    def unavailable_reason(self) -> str | None:
        xpu = getattr(torch, "xpu", None)
        if xpu is None:
            return f"this torch ({torch.__version__}) has no torch.xpu module: install torch 2.4 or newer built for XPU"
        try:
            compiled = xpu._is_compiled()
        except Exception as exc:  # noqa: BLE001 - a broken build is a reason, not a crash
            return f"probing XPU failed: {type(exc).__name__}: {exc}"
        if not compiled:
            return (f"this torch ({torch.__version__}) was built without XPU support: install an XPU build, "
                    "e.g. pip install torch --index-url https://download.pytorch.org/whl/xpu")
        no_device = self.no_visible_device(xpu, "torch is built for XPU but no Intel GPU is visible", ": check the GPU "
                                           "driver and Level Zero runtime (xpu-smi discovery, sycl-ls)", label="XPU")
        if no_device:
            return no_device
        if not _xccl_available():
            return (f"this torch ({torch.__version__}) sees an Intel GPU but has no 'xccl' process group: use "
                    "torch 2.8 or newer built for XPU")
        return None

    def describe(self) -> dict:
        return {**super().describe(), "xpu": getattr(torch.version, "xpu", None), "xccl": _xccl_available()}


def _xccl_available() -> bool:
    import torch.distributed as dist

    probe = getattr(dist, "is_xccl_available", None)
    return bool(probe and probe())


@accel_backends.hookimpl
def register_backends(register):
    register(XPUBackend())
