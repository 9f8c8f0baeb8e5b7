"""Reads the imports of the project's modules (without running them) to check the layer rules of
``docs/architecture.md``: who may import whom, and no import cycles."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("accel_backends", "engine")

# What engine/grpo may use of the engine: its public API, not the mechanics under it.
GRPO_MAY_IMPORT = ("engine", "engine.config", "engine.runtime", "engine.checkpoint", "engine.packing",
                   "engine.tiny_model", "engine.hookspecs", "engine.output_layer")
# engine/runs (what both trainers share) stands on that same public API and knows no trainer.
RUNS_MAY_IMPORT = GRPO_MAY_IMPORT
# engine/sft: the public API, engine/runs, and GRPO's tiny model directory writer (a shared test fixture).
SFT_MAY_IMPORT = GRPO_MAY_IMPORT + ("engine.grpo.fixture",)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module of the project's packages under ``root``, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(path, root)] = path
    return found


def imports(path: Path, root: Path, known: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every import in the file, at any depth (imports inside functions count too).

    Relative imports are resolved; ``from package import name`` counts as importing ``package.name`` when that is
    a module, else ``package``.
    """
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                yield node.lineno, candidate if candidate in known else source


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_violations(root: Path) -> list[str]:
    """Every import that breaks a layer rule, as ``file:line: importer -> imported (the rule)``."""
    known = modules(root)
    found = []
    for importer, path in known.items():
        for line, target in imports(path, root, known):
            if _inside(importer, "accel_backends") and _inside(target, "engine"):
                rule = "accel_backends imports nothing of engine"
            elif _inside(importer, "engine.runtime") and _inside(target, "engine.fsdp"):
                rule = "engine/runtime never imports engine/fsdp"
            elif (_inside(importer, "engine.packing") and _inside(target, "engine")
                  and not _inside(target, "engine.packing")):
                rule = "engine/packing imports nothing of the engine"
            elif (_inside(importer, "engine.runs") and _inside(target, "engine") and not _inside(target, "engine.runs")
                  and target not in RUNS_MAY_IMPORT):
                rule = "engine/runs uses the engine's public API only and imports no trainer"
            elif (_inside(importer, "engine.sft") and _inside(target, "engine") and not _inside(target, "engine.sft")
                  and not _inside(target, "engine.runs") and target not in SFT_MAY_IMPORT):
                rule = f"engine/sft uses the engine's public API and engine/runs only ({', '.join(SFT_MAY_IMPORT)})"
            elif (_inside(importer, "engine.grpo") and _inside(target, "engine") and not _inside(target, "engine.grpo")
                  and not _inside(target, "engine.runs") and not _inside(target, "engine.rollout")
                  and target not in GRPO_MAY_IMPORT):  # engine/rollout: the rollout layer under GRPO (issue 28)
                rule = f"engine/grpo uses the engine's public API only ({', '.join(GRPO_MAY_IMPORT)})"
            else:
                continue
            found.append(f"{path.relative_to(root)}:{line}: {importer} -> {target} ({rule})")
    return found


def import_cycles(root: Path) -> list[list[str]]:
    """Cycles among the project's modules (a module importing itself through others), each listed once."""
    known = modules(root)
    graph = {name: sorted({t for _, t in imports(path, root, known) if t in known and t != name})
             for name, path in known.items()}
    cycles, seen = [], set()
    for start in graph:
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for target in graph[node]:
                if target == start:
                    key = frozenset(trail)
                    if key not in seen:
                        seen.add(key)
                        cycles.append(trail + [start])
                elif target not in trail and target > start:  # each cycle found from its smallest member only
                    stack.append((target, trail + [target]))
    return cycles
