"""The tested torch range: pyproject.toml, ``accel-backends info``, docs/hardware.md and CI agree, and the torch
running these tests lies inside it with the public FSDP2 API the engine uses."""

import os
import re
from pathlib import Path

import pytest
import tomllib
import torch

from accel_backends import cli

ROOT = Path(__file__).resolve().parents[2]
LOW, HIGH = cli.TESTED_TORCH
RANGE_SPEC = f">={LOW[0]}.{LOW[1]},<{HIGH[0]}.{HIGH[1] + 1}"


def _requirement(requirements, name):
    (found,) = [r for r in requirements if re.match(rf"{name}\s*[<>=!~]", r)]
    return found[len(name):].replace(" ", "")


def test_pyproject_states_the_tested_range_for_torch_and_the_npu_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _requirement(project["dependencies"], "torch") == RANGE_SPEC
    # Each torch_npu release pins one exact torch: the extra must not pull one outside the range.
    assert _requirement(project["optional-dependencies"]["npu"], "torch-npu") == RANGE_SPEC


def test_ci_tests_both_ends_of_the_range():
    pinned = re.search(r"^torch==(\d+)\.(\d+)\.", (ROOT / "ci/constraints.txt").read_text(), re.M)
    assert (int(pinned[1]), int(pinned[2])) == HIGH, "the main leg runs the newest torch of the range"
    second_leg = re.search(r"ci/test-torch\.sh (\d+)\.(\d+)\.\d+", (ROOT / ".ci/run").read_text())
    assert (int(second_leg[1]), int(second_leg[2])) == LOW, "the second leg runs the oldest torch of the range"


def test_docs_state_the_same_range():
    text = (ROOT / "docs/hardware.md").read_text()
    assert f"torch {LOW[0]}.{LOW[1]} to {HIGH[0]}.{HIGH[1]}" in text


def test_this_torch_is_the_one_the_leg_asked_for_and_inside_the_range():
    expected = os.environ.get("ACCEL_EXPECT_TORCH")  # set by ci/test-torch.sh
    if expected:
        assert torch.__version__.split("+")[0] == expected
    assert cli.torch_version_check(torch.__version__)["in_tested_range"], torch.__version__


@pytest.mark.parametrize("name", ["set_requires_gradient_sync", "set_reshard_after_backward",
                                  "set_is_last_backward", "reshard", "unshard"])
def test_the_public_fsdp2_methods_the_engine_uses_exist(name):
    from torch.distributed.fsdp import FSDPModule

    assert callable(getattr(FSDPModule, name, None)), f"torch {torch.__version__} lacks FSDPModule.{name}"


@pytest.mark.parametrize("version,inside", [("2.10.0+cu128", True), ("2.13.0+cpu", True), ("2.11.1", True),
                                            ("2.8.0", False), ("2.9.1+cu126", False), ("2.14.0", False),
                                            ("3.0.0", False), ("nightly", False)])
def test_version_check(version, inside):
    doc = cli.torch_version_check(version)
    assert doc["in_tested_range"] is inside
    assert ("warning" in doc) is not inside
    if not inside:
        assert version in doc["warning"] and f"torch{RANGE_SPEC}" in doc["warning"]


def test_info_prints_the_torch_version_and_warns_outside_the_range(monkeypatch, capsys):
    assert cli.main(["info", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert re.search(rf"^torch\s+{re.escape(torch.__version__)} \(tested: {LOW[0]}\.{LOW[1]} to", out, re.M)
    assert "warning" not in err
    monkeypatch.setattr(torch, "__version__", "2.8.0")
    assert cli.main(["info", "cpu", "--json"]) == 0
    out, err = capsys.readouterr()
    assert '"in_tested_range": false' in out
    assert "accel-backends: warning: torch 2.8.0 is outside the tested range" in err
