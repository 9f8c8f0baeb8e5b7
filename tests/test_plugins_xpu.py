"""The Intel XPU plugin: installed from plugins/accel-backend-xpu, found, listed, and truthful where no XPU exists.

No Intel GPU is available here: the reasons for a machine with one are checked against a patched ``torch.xpu``
(a TEST STAND-IN), and nothing in this file has run on Intel hardware.
"""

import importlib.util
import json
import types

import pytest
import torch
from conftest import REPO, run_python

PLUGIN_FILE = REPO / "plugins" / "accel-backend-xpu" / "accel_backend_xpu" / "plugin.py"


@pytest.mark.slow
def test_installed_plugin_is_listed_with_the_reason(plugin_site):
    result = run_python(["-m", "accel_backends", "list", "--json"], env={"PYTHONPATH": plugin_site}, check=True)
    row = {r["name"]: r for r in json.loads(result.stdout)["backends"]}["xpu"]
    assert row["plugin"] == "accel-backend-xpu 0.1.0"
    assert (row["device_type"], row["dist_backend"], row["priority"]) == ("xpu", "xccl", 80)
    assert row["available"] is False and row["device_count"] == 0
    assert row["reason"].startswith(f"this torch ({torch.__version__}) was built without XPU support")


@pytest.mark.slow
def test_conformance_kit_reports_xpu_unavailable_and_skips_the_device_rules(plugin_site):
    result = run_python(["-m", "accel_backends.testing", "xpu"], env={"PYTHONPATH": plugin_site})
    lines = result.stdout.splitlines()
    assert "from accel-backend-xpu 0.1.0" in lines[0]
    assert lines[1].startswith("PASSED  attributes: name 'xpu'")
    assert lines[2].startswith("PASSED  availability: unavailable, with the reason: this torch")
    skipped = [line for line in lines if line.startswith("SKIPPED")]
    # 6 device rules (devices, memory, moves, rng, distributed, all-to-all) and 3 engine rules
    assert len(skipped) == 9 and all("built without XPU support" in line for line in skipped), skipped
    assert result.returncode == 0, "no applicable rule broke"


@pytest.fixture
def xpu_plugin():
    """The plugin module loaded from its source file (no sys.path change: later tests see no extra entry points)."""
    spec = importlib.util.spec_from_file_location("accel_backend_xpu_under_test", PLUGIN_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_xpu(compiled=True, available=True, count=1, error=None):
    """TEST STAND-IN for ``torch.xpu`` on a machine we do not have."""

    def probe(value):
        def call():
            if error is not None:
                raise error
            return value

        return call

    return types.SimpleNamespace(_is_compiled=probe(compiled), is_available=probe(available),
                                 device_count=probe(count), get_device_name=lambda i: f"Intel GPU {i}")


@pytest.mark.parametrize(
    ("xpu", "xccl", "expected"),
    [
        (fake_xpu(compiled=False), True, "was built without XPU support: install an XPU build"),
        (fake_xpu(available=False), True, "no Intel GPU is visible (ZE_AFFINITY_MASK='7'): check the GPU driver"),
        (fake_xpu(count=0), True, "no Intel GPU is visible"),
        (fake_xpu(error=RuntimeError("Level Zero: no driver")), True, "probing XPU failed: RuntimeError: Level Zero"),
        (fake_xpu(), False, "no 'xccl' process group: use torch 2.8 or newer"),
        (fake_xpu(), True, None),
    ],
)
def test_each_reason_says_what_is_missing(xpu_plugin, monkeypatch, xpu, xccl, expected):
    monkeypatch.setattr(torch, "xpu", xpu)
    monkeypatch.setattr(torch.distributed, "is_xccl_available", lambda: xccl, raising=False)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "7")
    reason = xpu_plugin.XPUBackend().unavailable_reason()
    assert reason is None if expected is None else expected in reason
    if expected is None:
        assert xpu_plugin.XPUBackend().describe()["devices"] == ["Intel GPU 0"]


def test_a_torch_without_xpu_module_is_a_reason(xpu_plugin, monkeypatch):
    monkeypatch.delattr(torch, "xpu")
    assert "has no torch.xpu module" in xpu_plugin.XPUBackend().unavailable_reason()


def test_plugin_registers_one_xpu_backend(xpu_plugin):
    registered = []
    xpu_plugin.register_backends(registered.append)
    (backend,) = registered
    assert backend.name == "xpu" and backend.supports_pinned_memory and backend.preferred_param_dtype == torch.bfloat16
