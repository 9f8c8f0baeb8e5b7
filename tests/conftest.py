import os
import subprocess
import sys
from pathlib import Path

import pytest

import accel_backends
from accel_backends.backends.cuda import CUDABackend

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean_backend_environment(monkeypatch):
    """Each test starts from the default selection rules and a registry built afresh."""
    for var in ("ACCEL_BACKEND", "ACCEL_BACKENDS_AUTOLOAD"):
        monkeypatch.delenv(var, raising=False)
    accel_backends.reset_registry()
    yield
    accel_backends.reset_registry()


def pytest_collection_modifyitems(config, items):
    if CUDABackend().is_available():
        return
    skip = pytest.mark.skip(reason="needs a real GPU through the cuda backend")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def run_python(code_or_args, env=None, timeout=180, check=False):
    """Run a fresh interpreter (so entry points and environment variables are read anew)."""
    env = dict(env or {})
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_BACKEND")}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.pop("PYTHONPATH", None)]))
    full_env.update(env)
    result = subprocess.run(
        [sys.executable, *args], env=full_env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result
