"""The layers hold (docs/architecture.md): no upward imports, engine/rollout and engine/grpo on the engine's public
API only, no import cycles; and the checks behind that verdict find each kind of violation they look for."""

from pathlib import Path

from import_layers import import_cycles, layer_violations

REPO = Path(__file__).resolve().parent.parent


def test_no_upward_imports_and_grpo_uses_the_public_api():
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
        "engine/fsdp/sharding.py": "",
        "engine/fsdp/offload.py": "from ..runtime import launcher\n",
        "engine/runtime/__init__.py": "",
        "engine/runtime/launcher.py": "from ..fsdp.offload import move\n",
        "engine/grpo/__init__.py": "",
        "engine/grpo/trainer.py": "from .. import FSDPEngine, fsdp\nfrom ..runtime import run\n",
        "engine/grpo/rollout.py": "import engine.runtime.launcher\n",
        "engine/grpo/config.py": "from .model import BUILTIN\n",
        "engine/grpo/model.py": "def check():\n    from .config import X\n",
        "engine/packing/__init__.py": "",
        "engine/packing/planner.py": "from ..runtime import launcher\n",
        "engine/runs/__init__.py": "",
        "engine/runs/report.py": "from ..grpo import trainer\n",
        "engine/sft/__init__.py": "",
        "engine/sft/cli.py": "from ..runs import report\nfrom ..grpo.config import X\n",
        "engine/rollout/__init__.py": "",
        "engine/rollout/single_turn.py": "from .. import runtime\nfrom ..runs import report\n",
        "engine/rollout/multi_turn/setup.py": "def rewards():\n    from ...grpo.rewards import Reward\n",
    })
    found = "\n".join(layer_violations(root))
    assert "accel_backends/kit.py:2: accel_backends.kit -> engine.fsdp.sharding (accel_backends imports" in found
    assert "engine.runtime.launcher -> engine.fsdp.offload (engine/runtime never imports engine/fsdp)" in found
    assert "engine/grpo/trainer.py:1: engine.grpo.trainer -> engine.fsdp (engine/grpo uses the engine's" in found
    assert "engine/grpo/rollout.py:1: engine.grpo.rollout -> engine.runtime.launcher (engine/grpo uses" in found
    assert "engine/packing/planner.py:1: engine.packing.planner -> engine.runtime.launcher (engine/packing" in found
    assert "engine/runs/report.py:1: engine.runs.report -> engine.grpo.trainer (engine/runs uses" in found
    assert "engine/sft/cli.py:2: engine.sft.cli -> engine.grpo.config (engine/sft uses" in found
    assert "engine/rollout/single_turn.py:2: engine.rollout.single_turn -> engine.runs.report (engine/rollout " \
           "imports nothing above the engine" in found
    assert "engine/rollout/multi_turn/setup.py:2: engine.rollout.multi_turn.setup -> engine.grpo.rewards " \
           "(engine/rollout imports nothing above the engine" in found
    assert "-> engine.runtime (" not in found and "-> engine (" not in found  # the public API is allowed
    assert "engine/sft/cli.py:1:" not in found  # a trainer may use the shared run layer
    assert len(found.splitlines()) == 9, found
    cycles = {tuple(cycle) for cycle in import_cycles(root)}
    assert ("engine.grpo.config", "engine.grpo.model", "engine.grpo.config") in cycles
    assert ("engine.fsdp.offload", "engine.runtime.launcher", "engine.fsdp.offload") in cycles
    assert len(cycles) == 2, cycles
