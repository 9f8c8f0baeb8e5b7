"""Huawei Ascend NPUs through ``torch_npu`` and HCCL.

``torch_npu`` is imported only when this backend is probed or used, never when it is registered: without
Ascend's CANN toolkit the import fails (``libhccl.so`` and friends are missing), and that failure must become an
unavailable reason, not a crash of every program that merely lists backends.
"""

from __future__ import annotations

import importlib

import torch

from ..base import DeviceBackend
from ..errors import BackendUnavailableError
from ..hookspecs import hookimpl

_CANN_HINT = (
    "install Ascend's CANN toolkit matching torch_npu and load its environment "
    "(source /usr/local/Ascend/ascend-toolkit/set_env.sh)"
)
_NOT_PROBED = object()


class NPUBackend(DeviceBackend):
    name = "npu"
    device_type = "npu"
    dist_backend = "hccl"
    priority = 90
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    supports_pinned_memory = True
    preferred_param_dtype = torch.bfloat16

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
        try:
            if not torch.npu.is_available() or torch.npu.device_count() == 0:
                return (
                    f"torch_npu imported but no NPU is visible{self._visible_devices_hint()}: "
                    "check the driver with npu-smi info and the visible-devices variable"
                )
        except Exception as exc:  # noqa: BLE001 - a broken driver is a reason, not a crash
            return f"probing the NPU failed: {type(exc).__name__}: {exc}"
        return None

    def describe(self) -> dict:
        info = {"torch": torch.__version__}
        if self._import_torch_npu() is None:
            info["torch_npu"] = getattr(importlib.import_module("torch_npu"), "__version__", "unknown")
            if self.is_available():
                info["devices"] = [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())]
        return info


def _describe_import_failure() -> str | None:
    try:
        importlib.import_module("torch_npu")
    except ModuleNotFoundError as exc:
        if exc.name == "torch_npu":
            return (
                f"torch_npu is not installed: pip install torch-npu=={torch.__version__.split('+')[0]} "
                f"(the extra accel-backends[npu]) and {_CANN_HINT}"
            )
        return f"torch_npu failed to import: {exc}"
    except (ImportError, OSError) as exc:
        return f"torch_npu failed to import: {exc}: {_CANN_HINT}"
    except Exception as exc:  # noqa: BLE001 - vendor packages raise all sorts of things at import
        return f"torch_npu failed to import: {type(exc).__name__}: {exc}"
    if not hasattr(torch, "npu"):
        return "torch_npu imported but did not register torch.npu: reinstall torch_npu matching this torch"
    return None


@hookimpl
def register_backends(register):
    register(NPUBackend())
