"""The layers hold (docs/architecture.md): floors engine < rollout < train < rl and offline < RL algorithms and
objectives < bench with no upward import, the floors above the engine on its public API, trainers (algorithms,
objectives) never importing each other (found from the tree: a new folder is covered), engine/rl never importing
engine/offline, no import cycles; and the checks behind that verdict find each kind of violation they look for."""

from pathlib import Path

from import_layers import import_cycles, layer_violations

REPO = Path(__file__).resolve().parents[2]


def test_no_upward_imports_and_the_floors_use_the_public_api():
    assert len(list((REPO / "engine").rglob("*.py"))) > 30, "the engine package is missing"
    violations = layer_violations(REPO)
    assert not violations, "imports across the layers' rules:\n" + "\n".join(violations)


def test_no_import_cycles():
    cycles = import_cycles(REPO)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checks_find_every_kind_of_violation(tmp_path):
    root = _tree(tmp_path, {
        "accel_backends/__init__.py": "",
        "accel_backends/kit.py": "def rule():\n    from engine.fsdp import sharding\n",  # lazy, still upward
        "engine/__init__.py": "from .engine import FSDPEngine\n",
        "engine/engine.py": "from .fsdp import sharding\n",
        "engine/fsdp/__init__.py": "",
        "engine/fsdp/sharding.py": "from ..train import loop\n",  # the engine imports the frame
        "engine/fsdp/offload.py": "from ..runtime import launcher\n",
        "engine/runtime/__init__.py": "",
        "engine/runtime/launcher.py": "from ..fsdp.offload import move\n",
        "engine/packing/__init__.py": "",
        "engine/packing/planner.py": "from ..runtime import launcher\n",
        "engine/rollout/__init__.py": "",
        "engine/rollout/single_turn.py": "from ..train import recipe\nfrom .. import FSDPEngine\n",
        "engine/train/__init__.py": "",
        "engine/train/recipe.py": "",
        "engine/train/loop.py": "def run():\n    from ..rl.algorithms.grpo import trainer\n",
        "engine/train/report.py": "from ..fsdp import sharding\n",
        "engine/rl/__init__.py": "",
        "engine/rl/batches.py": "from ..train import recipe\nfrom ..rollout import single_turn\n"
                                "def plan():\n    from .algorithms.grpo import config\n",  # an algorithm's, lazily
        "engine/rl/logprobs.py": "from ..fsdp import sharding\nfrom .. import FSDPEngine\n",
        "engine/rl/step.py": "from ..offline import parts\nfrom .algorithms.rloo import algorithm\n",
        "engine/offline/__init__.py": "",
        "engine/offline/parts.py": "",
        "engine/rl/algorithms/__init__.py": "",
        "engine/rl/algorithms/rloo/__init__.py": "",  # a new folder: a trainer of its own, found in the tree
        "engine/rl/algorithms/rloo/algorithm.py": "from ...batches import X\nfrom ..grpo import config\n",
        "engine/rl/algorithms/grpo/__init__.py": "",
        "engine/rl/algorithms/grpo/trainer.py": "from ....rollout import single_turn\nfrom ....train import loop\n"
                                                "from ....bench import cli\nfrom ... import batches\n",
        "engine/rl/algorithms/grpo/config.py": "from .model import BUILTIN\n",
        "engine/rl/algorithms/grpo/model.py": "def check():\n    from .config import X\n",
        "engine/offline/objectives/__init__.py": "",
        "engine/offline/objectives/sft/__init__.py": "",
        "engine/offline/objectives/sft/cli.py": "from ....train import recipe\n"
                                                "from ....rl.algorithms.grpo.config import X\n",
        "engine/bench/__init__.py": "",
        "engine/bench/cli.py": "from ..offline.objectives.sft import cli\nfrom ..fsdp import sharding\n",
    })
    found = "\n".join(layer_violations(root))
    assert "accel_backends/kit.py:2: accel_backends.kit -> engine.fsdp.sharding (accel_backends imports" in found
    assert "engine.runtime.launcher -> engine.fsdp.offload (engine/runtime never imports engine/fsdp)" in found
    assert "engine/packing/planner.py:1: engine.packing.planner -> engine.runtime.launcher (engine/packing" in found
    assert "engine.fsdp.sharding -> engine.train.loop (the engine imports nothing above it (engine/train))" in found
    assert "engine.rollout.single_turn -> engine.train.recipe (engine/rollout imports nothing above it" in found
    assert "engine.train.loop -> engine.rl.algorithms.grpo.trainer (engine/train imports nothing above it (an RL " \
        "algorithm))" in found
    assert "engine.train.report -> engine.fsdp.sharding (engine/train uses the engine's public API only)" in found
    assert "engine.rl.algorithms.grpo.trainer -> engine.bench.cli (an RL algorithm imports nothing above it" in found
    assert "engine/rl/batches.py:4: engine.rl.batches -> engine.rl.algorithms.grpo.config (engine/rl imports nothing " \
        "above it (an RL algorithm))" in found
    assert "engine.rl.logprobs -> engine.fsdp.sharding (engine/rl uses the engine's public API only)" in found
    assert "engine.offline.objectives.sft.cli -> engine.rl.algorithms.grpo.config (trainers never import each " \
        "other)" in found
    assert "engine.rl.algorithms.rloo.algorithm -> engine.rl.algorithms.grpo.config (trainers never import each " \
        "other)" in found
    assert "engine.rl.step -> engine.offline.parts (engine/rl never imports engine/offline)" in found
    assert "engine.rl.step -> engine.rl.algorithms.rloo.algorithm (engine/rl imports nothing above it (an RL " \
        "algorithm))" in found
    # downward, the public API, the bench's measurements
    allowed = ("engine.rollout.single_turn -> engine (", "-> engine.rollout.single_turn (",
               "engine.rl.algorithms.grpo.trainer -> engine.train.loop (",
               "engine.offline.objectives.sft.cli -> engine.train.recipe (", "-> engine.offline.objectives.sft.cli (",
               "engine.bench.cli -> engine.fsdp.sharding (", "engine.rl.batches -> engine.train.recipe (",
               "engine.rl.batches -> engine.rollout.single_turn (", "engine.rl.logprobs -> engine (",
               "engine.rl.algorithms.grpo.trainer -> engine.rl.batches (",
               "engine.rl.algorithms.rloo.algorithm -> engine.rl.batches (")
    assert not [a for a in allowed if a in found], found
    assert len(found.splitlines()) == 14, found
    cycles = {tuple(cycle) for cycle in import_cycles(root)}
    assert ("engine.rl.algorithms.grpo.config", "engine.rl.algorithms.grpo.model",
            "engine.rl.algorithms.grpo.config") in cycles
    assert ("engine.fsdp.offload", "engine.runtime.launcher", "engine.fsdp.offload") in cycles
    assert ("engine.rl.algorithms.grpo.trainer", "engine.train.loop",
            "engine.rl.algorithms.grpo.trainer") in cycles  # upward


def test_training_on_a_fixed_data_set_stands_apart_from_rl_and_the_rollout_layer():
    """engine/offline (SFT, DPO, reward models) imports the frame and the engine, never engine/rollout nor engine/rl
    (issue 47): a supervised objective runs without generating, and RL may change without touching it."""
    from import_layers import imports, modules

    known = modules(REPO)
    offline = {name: path for name, path in known.items() if name == "engine.offline" or
               name.startswith("engine.offline.")}
    assert "engine.offline.objectives.sft" in offline, "engine/offline is missing"
    found = [f"{path.relative_to(REPO)}:{line}: {name} -> {target}" for name, path in offline.items()
             for line, target in imports(path, REPO, known)
             if any(target == top or target.startswith(top + ".") for top in ("engine.rollout", "engine.rl"))]
    assert not found, "engine/offline imports RL or the rollout layer:\n" + "\n".join(found)
