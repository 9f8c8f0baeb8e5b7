"""``accel-backends list`` and ``info`` where ``import torch`` itself fails: a stand-in torch_npu distribution whose
``torch.backends`` entry point raises (what a real torch_npu does without CANN's libraries) breaks torch's
device-backend autoload; the command runs anyway and prints the diagnosis and the fix."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO

from accel_backends.torch_import import _is_diagnostics_command

THIS_TORCH = torch.__version__.split("+")[0]


def broken_torch_npu(root: Path, version: str, torch_requirement: str) -> Path:
    """An installed-looking torch_npu (package + dist-info with its torch.backends entry point) that cannot load."""
    (root / "torch_npu").mkdir(parents=True)
    (root / "torch_npu" / "__init__.py").write_text(
        'raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n')
    info = root / f"torch_npu-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch-npu\nVersion: {version}\n"
                                   f"Requires-Dist: {torch_requirement}\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return root


def run_command(args, site):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_BACKEND", "TORCH_DEVICE_BACKEND"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site)])
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.mark.slow
def test_list_runs_and_tells_to_source_cann_when_the_autoload_raises(tmp_path):
    site = broken_torch_npu(tmp_path, f"{THIS_TORCH}.post1", f"torch=={THIS_TORCH}")
    script = Path(sys.executable).with_name("accel-backends")  # the console script, as a user runs it
    command = [str(script)] if script.exists() else [sys.executable, "-m", "accel_backends"]
    result = run_command([*command, "list"], site)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == ("accel-backends: import torch fails: torch's device-backend autoload ran the torch.backends "
                        f"entry point 'torch_npu' (torch-npu {THIS_TORCH}.post1), which raised ImportError: "
                        "libhccl.so: cannot open shared object file: No such file or directory")
    assert lines[1].startswith("  fix (npu): load CANN's environment") and "source /usr/local/Ascend" in lines[1]
    assert "  npu: torch_npu failed to import: libhccl.so" in result.stdout  # the backend's own lazy import
    assert "selected: cpu (auto-detected)" in result.stdout


@pytest.mark.slow
def test_info_json_names_the_matching_torch_npu_for_a_mismatched_one(tmp_path):
    site = broken_torch_npu(tmp_path, "2.9.0.post1", "torch==2.9.0")
    result = run_command([sys.executable, "-m", "accel_backends", "info", "npu", "--json"], site)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    failure = doc["torch_autoload_failure"]
    assert failure["extension"] == "torch_npu" and failure["distribution"] == "torch-npu 2.9.0.post1"
    assert failure["advice"]["npu"].startswith(f"torch_npu 2.9.0.post1 is built for torch 2.9.0, but torch "
                                               f"{torch.__version__} is installed: pip install "
                                               f"'torch-npu=={THIS_TORCH}.*'")
    assert not doc["available"] and doc["reason"].startswith("torch_npu 2.9.0.post1 is built for torch 2.9.0")


def test_only_the_accel_backends_command_runs_itself_again(monkeypatch):
    for argv, orig, expected in ((["/venv/bin/accel-backends", "list"], None, True),
                                 (["-m", "list"], ["python", "-m", "accel_backends", "list"], True),
                                 (["-m"], ["python", "-m", "accel_backends.cli", "info"], True),
                                 (["-m"], ["python", "-m", "engine.rl.algorithms.grpo.cli"], False),
                                 (["/venv/bin/accel-grpo"], ["python", "/venv/bin/accel-grpo"], False)):
        monkeypatch.setattr(sys, "argv", argv)
        monkeypatch.setattr(sys, "orig_argv", orig or ["python", *argv])
        assert _is_diagnostics_command() is expected, argv
