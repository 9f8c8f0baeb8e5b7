import os
import shutil
import subprocess
import sys
from pathlib import Path

import distributed
import pytest
from rank_pool import RankPool

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


@pytest.fixture(scope="session", autouse=True)
def rank_pool():
    """The warm pool of two gloo ranks that ``distributed.run_ranks`` uses (workers start at its first job)."""
    pool = RankPool()
    distributed.POOL = pool
    yield pool
    distributed.POOL = None
    pool.close()


def pytest_collection_modifyitems(config, items):
    # The NPU stand-in renames torch's private-use device for the rest of the process, after which an in-process
    # checkpoint save (DCP asks that device's hooks) fails: its contract tests run last.
    items.sort(key=lambda item: item.path.name == "test_npu_backend_contract.py")
    if CUDABackend().is_available():
        return
    skip = pytest.mark.skip(reason="needs a real GPU through the cuda backend")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


BROKEN_PLUGIN_PYPROJECT = """
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "accel-broken-backend"
version = "9.9"

[project.entry-points.accel_backends]
broken = "accel_broken_backend"
"""

INSTALLED_PLUGINS = ("accel-example-backend", "accel-backend-xpu", "accel-trace", "accel-example-trainer")


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory):
    """A folder where pip installed the plugins under plugins/ and one that raises on import (put it on PYTHONPATH).

    One pip call per session: building and installing costs seconds, and every plugin test shares the folder.
    """
    broken = tmp_path_factory.mktemp("broken-src")
    (broken / "pyproject.toml").write_text(BROKEN_PLUGIN_PYPROJECT)
    (broken / "accel_broken_backend.py").write_text(
        'raise ImportError("libvendor.so: cannot open shared object file")\n'
    )
    # Built from copies: setuptools writes build/ and *.egg-info beside the sources it builds, and that metadata in
    # the checkout would register a plugin for any later test (or CI leg) that puts its folder on sys.path.
    sources = tmp_path_factory.mktemp("plugin-src")
    copies = [shutil.copytree(REPO / "plugins" / name, sources / name,
                              ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
              for name in INSTALLED_PLUGINS]
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), *map(str, copies), str(broken)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    return str(target)


def without_module(folder: Path, name: str) -> str:
    """A folder for the front of PYTHONPATH in which ``import name`` fails as where the package is not installed
    (a GPU image without matplotlib, say)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n")
    return str(folder)


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
