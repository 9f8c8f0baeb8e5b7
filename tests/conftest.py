import fcntl
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
from accel_backends.collector import freeze_startup

REPO = Path(__file__).resolve().parent.parent
freeze_startup()  # this pytest process is ours: torch's objects are never walked again (accel_backends/collector.py)


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


# Each stage's costliest files, most seconds first (`--durations=0` summed per file, 2-core machine, stop 53).
# ci/test.sh hands whole files to two pytest-xdist workers in collection order: starting with these lets both
# workers end together instead of one starting the longest file last. A file not named here only runs later.
COSTLIEST_FIRST = (
    # main
    "test_gpu_check.py", "test_grpo_run.py", "test_grpo_faults.py", "test_rank_failures.py", "test_preference_run.py",
    "test_trainer_plugin.py", "test_rank_pool.py", "test_grpo_run_outputs.py", "test_bench.py", "test_conformance.py",
    "test_agent_docs.py", "test_spawn.py", "test_sft_sequence_parallel.py", "test_sft_run.py", "test_rollout_card.py",
    "test_grpo_sequence_parallel.py",
    # unit
    "test_vllm_server.py", "test_judge_failures.py", "test_compat.py",
)


def collection_rank(item) -> tuple[bool, int]:
    """Where an item's file runs: the NPU stand-in's contract tests last (the stand-in renames torch's private-use
    device for the rest of the process, after which an in-process checkpoint save fails), the costliest files
    first."""
    name = item.path.name
    costly = COSTLIEST_FIRST.index(name) if name in COSTLIEST_FIRST else len(COSTLIEST_FIRST)
    return name == "test_npu_backend_contract.py", costly


def pytest_collection_modifyitems(config, items):
    items.sort(key=collection_rank)  # stable: a file's tests keep their order
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

    One pip call per session, shared by the pytest-xdist workers too: building and installing costs seconds, and
    every plugin test only reads the folder.
    """
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # each worker's base folder sits in the one folder of this pytest run
    target = shared / "plugin-site"
    with open(shared / "plugin-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker builds; the other waits, then reads the same folder
        if not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)
            install_plugins(shared / "plugin-src", target)
            (target / ".complete").touch()
    return str(target)


def install_plugins(sources: Path, target: Path) -> None:
    broken = sources / "accel-broken-backend"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "pyproject.toml").write_text(BROKEN_PLUGIN_PYPROJECT)
    (broken / "accel_broken_backend.py").write_text(
        'raise ImportError("libvendor.so: cannot open shared object file")\n'
    )
    # Built from copies: setuptools writes build/ and *.egg-info beside the sources it builds, and that metadata in
    # the checkout would register a plugin for any later test (or CI leg) that puts its folder on sys.path.
    copies = [shutil.copytree(REPO / "plugins" / name, sources / name, dirs_exist_ok=True,
                              ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
              for name in INSTALLED_PLUGINS]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), *map(str, copies), str(broken)],
        check=True, capture_output=True, text=True, timeout=300,
    )


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
