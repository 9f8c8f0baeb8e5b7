"""accel_backends/torch_import.py in this process: what it reads from the error ``import torch`` raises when torch's
device-backend autoload fails, and from the variable a re-executed ``accel-backends`` is handed. (The re-execution
itself runs in tests/test_torch_autoload.py, in fresh processes.)"""

import importlib.metadata
import json

from accel_backends import torch_import


class _Dist:
    metadata = {"Name": "torch-npu"}
    version = "2.13.0"


class _EntryPoint:
    name, value, dist = "npu", "torch_npu:_autoload", _Dist()


def _autoload_error(extension: str) -> RuntimeError:
    """The error ``import torch`` raises when the autoload's entry point ``extension`` raised an ImportError."""
    try:
        try:
            raise ImportError("libhccl.so: cannot open shared object file")
        except ImportError as cause:
            raise RuntimeError(f"Failed to load the backend extension: {extension}. You can disable extension "
                               "auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.") from cause
    except RuntimeError as exc:
        return exc


def test_the_failing_entry_point_is_named_with_its_distribution_and_cause(monkeypatch):
    others = [type("Other", (), {"name": "xpu", "value": "x:y", "dist": None})()]
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [*others, _EntryPoint()] if group == "torch.backends" else [])
    failure = torch_import.autoload_failure(_autoload_error("npu"))
    assert failure == {"extension": "npu", "entry_point": "torch_npu:_autoload", "distribution": "torch-npu 2.13.0",
                       "error": "ImportError: libhccl.so: cannot open shared object file"}
    assert torch_import.describe(failure) == (
        "import torch fails: torch's device-backend autoload ran the torch.backends entry point 'npu' (torch-npu "
        "2.13.0), which raised ImportError: libhccl.so: cannot open shared object file")


def test_an_extension_without_an_installed_entry_point_is_still_named():
    failure = torch_import.autoload_failure(_autoload_error("vendor_ext"))
    assert failure == {"extension": "vendor_ext", "entry_point": None, "distribution": None,
                       "error": "ImportError: libhccl.so: cannot open shared object file"}
    assert torch_import.describe(failure).endswith("entry point 'vendor_ext', which raised ImportError: libhccl.so: "
                                                   "cannot open shared object file")


def test_other_errors_are_not_taken_for_an_autoload_failure():
    assert torch_import.autoload_failure(ImportError("No module named 'torch'")) is None
    assert torch_import.autoload_failure(RuntimeError("CUDA error: out of memory")) is None
    assert torch_import.autoload_failure(ImportError("Failed to load the backend extension: x.")) is None


def test_the_handed_failure_is_read_and_a_garbled_one_ignored(monkeypatch):
    monkeypatch.delenv(torch_import.FAILURE_ENV, raising=False)
    assert torch_import.reported_failure() is None
    monkeypatch.setenv(torch_import.FAILURE_ENV, json.dumps({"extension": "npu"}))
    assert torch_import.reported_failure() == {"extension": "npu"}
    monkeypatch.setenv(torch_import.FAILURE_ENV, "{not json")
    assert torch_import.reported_failure() is None
