"""Old module paths (``engine/compat.py``) are the same module objects as their new homes, submodules included."""

import importlib
import subprocess
import sys

import engine.compat as compat


def test_every_alias_is_its_targets_module_object():
    for old, new in compat.ALIASES.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
        assert importlib.import_module(new).__spec__.name == new  # the alias did not re-stamp the real module


def test_a_packages_alias_covers_its_submodules_and_unknown_names_stay_unknown():
    assert compat.target_of("engine.grpo.rollout_engines.hf") == "engine.rollout.engines.hf"
    assert compat.target_of("engine.not_a_module") is None
    assert compat.target_of("engine.recipes.ppo.schema") == "engine.rl.algorithms.ppo.schema"  # issue 47's moves
    import engine.grpo.rollout_engines.hf as old
    import engine.rollout.engines.hf as new

    assert old is new


def test_python_dash_m_runs_an_old_path():
    out = subprocess.run([sys.executable, "-c", "import engine, runpy; runpy.run_module('engine.grpo.tasks', "
                          "run_name='probe'); print('ran')"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ran" in out.stdout, out.stderr
    out = subprocess.run([sys.executable, "-m", "engine.grpo.cli", "--help"], capture_output=True, text=True,
                         timeout=120)  # accel-grpo's first home: now an alias of the algorithm's command
    assert out.returncode == 0 and "accel-grpo" in out.stdout, out.stderr
