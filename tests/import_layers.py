"""Reads the imports of the project's modules (without running them) to check the layer rules of
``docs/architecture.md``: who may import whom, and no import cycles."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("accel_backends", "engine")

# The floors, lowest first: the engine itself (everything under engine/ not named here) < the rollout layer < the
# training frame < the RL layer < the trainers (RL algorithms and
# supervised objectives) < the benchmarks. The first package that holds a module names its floor.
FLOORS = (("engine.rollout", 1, "engine/rollout"), ("engine.train", 2, "engine/train"),
          ("engine.rl.algorithms", 4, "an RL algorithm"), ("engine.rl", 3, "engine/rl"),
          ("engine.offline.objectives", 4, "an objective"), ("engine.offline", 3, "engine/offline"),
          ("engine.bench", 5, "engine/bench"))
BENCH = 5
# What the floors above the engine may use of it: its public API, not the mechanics under it.
PUBLIC_API = ("engine", "engine.config", "engine.runtime", "engine.checkpoint", "engine.packing", "engine.tiny_model",
              "engine.hookspecs", "engine.output_layer", "engine.object_loader", "engine.demo_model",
              "engine.sequence_parallel")
# Where the trainers' packages are: every folder under one is a trainer of its own (found in the tree, so a new
# algorithm or objective is covered without editing this file); trainers never import each other.
TRAINER_ROOTS = ("engine/rl/algorithms", "engine/offline/objectives")


def trainers(root: Path) -> dict[str, str]:
    """``{package: trainer}``: every package under a trainer root."""
    found = {}
    for base in TRAINER_ROOTS:
        for init in sorted((root / base).glob("*/__init__.py")):
            found[".".join((*Path(base).parts, init.parent.name))] = init.parent.name
    return found


def floor(module: str) -> tuple[int, str]:
    """``(level, name)`` of the floor a module of the project stands on (0: the engine itself)."""
    for package, level, name in FLOORS:
        if _inside(module, package):
            return level, name
    return 0, "the engine"


def trainer_of(module: str, packages: dict[str, str]) -> str | None:
    return next((name for package, name in packages.items() if _inside(module, package)), None)


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


def _rule(importer: str, target: str, packages: dict[str, str]) -> str | None:
    """The layer rule ``importer -> target`` breaks, or None."""
    if _inside(importer, "accel_backends"):
        return "accel_backends imports nothing of engine" if _inside(target, "engine") else None
    if not _inside(target, "engine"):
        return None
    if _inside(importer, "engine.runtime") and _inside(target, "engine.fsdp"):
        return "engine/runtime never imports engine/fsdp"
    if _inside(importer, "engine.packing") and not _inside(target, "engine.packing"):
        return "engine/packing imports nothing of the engine"
    if _inside(importer, "engine.rl") and _inside(target, "engine.offline"):
        return "engine/rl never imports engine/offline"
    (mine, mine_name), (theirs, theirs_name) = floor(importer), floor(target)
    if theirs > mine:
        return f"{mine_name} imports nothing above it ({theirs_name})"
    if mine and mine < BENCH and not theirs and target not in PUBLIC_API:  # the benchmarks measure the mechanics
        return f"{mine_name} uses the engine's public API only"
    mine, theirs = trainer_of(importer, packages), trainer_of(target, packages)
    if mine and theirs and mine != theirs:
        return "trainers never import each other"
    return None


def layer_violations(root: Path) -> list[str]:
    """Every import that breaks a layer rule, as ``file:line: importer -> imported (the rule)``."""
    known, packages = modules(root), trainers(root)
    found = []
    for importer, path in known.items():
        for line, target in imports(path, root, known):
            rule = _rule(importer, target, packages)
            if rule:
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
