"""STAND-IN for Huawei's ``torch_npu``, for contract tests only. It is NOT the real package.

It does at import what the real one does that our NPU backend relies on: names the PrivateUse1 device type
``npu`` and provides ``torch.npu`` with the device-module functions. Every call is recorded in ``CALLS`` so tests
can check that the backend used the NPU API (and not, say, ``torch.cuda``). ``STANDIN_NPU_COUNT`` sets how many
devices it pretends to see.
"""

import os
import types

import torch

__version__ = "0.0.0-standin"
CALLS: list[tuple] = []
_state = {"current": 0, "peak": 7 * 2**20}


def _recorded(name, result=None):
    def fn(*args, **kwargs):
        CALLS.append((name, args))
        return result(*args) if callable(result) else result

    return fn


def _count():
    return int(os.environ.get("STANDIN_NPU_COUNT", "2"))


def _set_device(index):
    _state["current"] = index


def _reset_peak():
    _state["peak"] = 0


def _get_cann_version(module="CANN"):
    """``torch_npu.npu.utils.get_cann_version``: a component's version ("" for an unknown component)."""
    CALLS.append(("get_cann_version", (module,)))
    return {"CANN": "9.0.RC1", "DRIVER": "25.2.0"}.get(module, "")


npu = types.SimpleNamespace(
    utils=types.SimpleNamespace(get_cann_version=_get_cann_version),
    is_available=_recorded("is_available", lambda: _count() > 0),
    device_count=_recorded("device_count", lambda: _count()),
    current_device=_recorded("current_device", lambda: _state["current"]),
    set_device=_recorded("set_device", _set_device),
    synchronize=_recorded("synchronize"),
    memory_allocated=_recorded("memory_allocated", 5 * 2**20),
    memory_reserved=_recorded("memory_reserved", 8 * 2**20),
    max_memory_allocated=_recorded("max_memory_allocated", lambda: _state["peak"]),
    mem_get_info=_recorded("mem_get_info", (60 * 2**30, 64 * 2**30)),
    reset_peak_memory_stats=_recorded("reset_peak_memory_stats", _reset_peak),
    empty_cache=_recorded("empty_cache"),
    manual_seed_all=_recorded("manual_seed_all"),
    get_rng_state=_recorded("get_rng_state", lambda: torch.tensor([1, 2, 3], dtype=torch.uint8)),
    set_rng_state=_recorded("set_rng_state"),
    get_device_name=_recorded("get_device_name", "Ascend910B (stand-in)"),
    _is_in_bad_fork=lambda: False,
)

if torch._C._get_privateuse1_backend_name() != "npu":
    torch.utils.rename_privateuse1_backend("npu")
torch.npu = npu
