"""docs/plugins.md matches the code: its examples run, its rule table lists the kit's rules."""

import re
import types

import torch
from conftest import REPO

import accel_backends
from accel_backends.testing import RULE_NAMES, run_conformance
from engine import events

DOC = (REPO / "docs" / "plugins.md").read_text()


def python_blocks():
    return re.findall(r"```python\n(.*?)```", DOC, flags=re.S)


def run_block(marker: str) -> types.SimpleNamespace:
    (source,) = [block for block in python_blocks() if marker in block]
    namespace = {"__name__": "doc_example"}
    exec(compile(source, f"docs/plugins.md ({marker})", "exec"), namespace)
    return types.SimpleNamespace(**namespace)


def test_the_backend_example_is_under_50_lines_and_keeps_the_contract_here():
    (source,) = [block for block in python_blocks() if "class XPUBackend" in block]
    assert len(source.splitlines()) < 50
    example = run_block("class XPUBackend")
    registered = []
    example.register_backends(registered.append)
    (backend,) = registered
    results = {r.rule: r for r in run_conformance(backend, rules=("attributes", "availability", "memory"))}
    assert results["attributes"].status == results["availability"].status == "passed"
    if not torch.xpu.is_available():
        assert "built without XPU support" in backend.unavailable_reason()
        assert results["memory"].status == "skipped"


def test_the_observer_example_counts_bytes():
    example = run_block("moved[(what, destination)]")
    plugin = types.SimpleNamespace(on_transfer=example.on_transfer)
    accel_backends.register_plugin(plugin)
    events.transfer(None, "params", "cpu", 100, seconds=0.1)
    events.transfer(None, "params", "cpu", 20)
    assert example.moved == {("params", "cpu"): 120}


def test_the_rule_table_lists_every_rule():
    table = {name for row in re.findall(r"^\| `([a-z0-9`, -]+)` \|", DOC, flags=re.M)
             for name in re.split(r"`, `", row)}
    assert set(RULE_NAMES) <= table, sorted(set(RULE_NAMES) - table)
