"""Old module paths, in one place, each the very module object of its new home (so a hook, a class or a registered
reward imported either way is the same), kept working until ``REMOVED_IN``. Plugins, configs (``data.reward=
engine.grpo.tasks:echo_reward``), scripts and ``python -m`` written before a move keep running; new code imports
the new path. An entry maps an old dotted path to the new one; a package's entry covers its submodules too
(``engine.grpo.rollout_engines.hf`` is ``engine.rollout.engines.hf``) unless a longer entry names them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

REMOVED_IN = "0.9"

ALIASES: dict[str, str] = {
    # GRPO's first home (public in the architecture notes: engine.grpo.algorithms)
    "engine.grpo": "engine.rl.algorithms.grpo",
    "engine.grpo.algorithms": "engine.rl.formulas",
    "engine.grpo.cli": "engine.rl.algorithms.grpo.cli",
    "engine.grpo.rollout_engines": "engine.rollout.engines",
    "engine.grpo.tasks": "engine.rl.prompts",

    # the RL layer's modules under the GRPO recipe's package, where they lived before engine/rl (issue 36)
    **{f"engine.recipes.grpo.{name}": f"engine.rl.{name}" for name in (
        "ahead", "batches", "evaluate", "groups", "logprobs", "model", "prompt_types", "prompts",
        "rewards", "rollout_correction", "scoring", "step_metrics", "tokenizer", "validation")},

    # RL algorithms (engine/rl/algorithms/...): each recipe folder became its algorithm's package (issue 47)
    "engine.recipes": "engine.rl.algorithms",
    "engine.recipes.grpo": "engine.rl.algorithms.grpo",
    "engine.recipes.grpo.algorithms": "engine.rl.formulas",
    "engine.recipes.ppo": "engine.rl.algorithms.ppo",
    "engine.recipes.ppo.recipe": "engine.rl.algorithms.ppo.checks",
    "engine.recipes.distill": "engine.rl.algorithms.distill",
    "engine.recipes.distill.recipe": "engine.rl.algorithms.distill.checks",
    "engine.rl.critic": "engine.rl.algorithms.ppo.critic",
    "engine.rl.teacher": "engine.rl.algorithms.distill.teacher",

    # supervised objectives (engine/offline/...; issue 47): the shared machinery left engine/rl, the recipes became
    # objectives of one supervised step, and accel-sft's command left engine/sft
    "engine.rl.offline": "engine.offline",
    "engine.recipes.sft": "engine.offline.objectives.sft",
    "engine.recipes.dpo": "engine.offline.objectives.dpo",
    "engine.recipes.rm": "engine.offline.objectives.rm",
    "engine.sft": "engine.offline.objectives.sft",
}


def target_of(name: str) -> str | None:
    """The new path of ``name``, from its own entry or from the longest entry naming a package above it."""
    if name in ALIASES:
        return ALIASES[name]
    head, _, tail = name.rpartition(".")
    while head:
        if head in ALIASES:
            return f"{ALIASES[head]}.{name[len(head) + 1:]}"
        head, _, last = head.rpartition(".")
        tail = f"{last}.{tail}"
    return None


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module already imported at its new one (``sys.modules`` then holds one object under
    both names). ``get_code`` lets ``python -m old.path`` run the new module's code."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.kept_spec = module.__spec__  # the import system stamps the alias's spec on it; exec_module restores it
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.kept_spec

    def get_code(self, fullname):
        """``python -m`` runs the new module under the caller's name, its relative imports resolved at its home."""
        return compile(f"import runpy\nrunpy.run_module({self.target!r}, run_name=__name__, alter_sys=True)\n",
                       f"<alias of {self.target}>", "exec")


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = target_of(fullname) if fullname.startswith("engine.") else None
        if new is None:
            return None
        real = importlib.util.find_spec(new)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new), is_package=real.submodule_search_locations
                                               is not None)


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
