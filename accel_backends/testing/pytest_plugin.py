"""The kit as a pytest plugin: one test item per rule.

Two ways in:

* ``pytest -p accel_backends.testing --accel-backend NAME [--accel-nproc 2]`` adds the kit's items to the run
  (no test file needed);
* in a vendor's own suite, subclass ``BackendConformance`` and set ``backend``; pytest collects one test per rule.

The multi-process rules share one job per backend and process count, started by the first of them to run.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from .kit import BackendRef, RuleResult, all_rules, resolve, rule_named, rule_names, run_multi_process, run_rule


@functools.lru_cache(maxsize=None)
def _multi_process_results(backend: BackendRef, nproc: int) -> dict[str, RuleResult]:
    names = tuple(rule.name for rule in all_rules() if rule.multi_process)
    return {result.rule: result for result in run_multi_process(backend, names, nproc)}


def conformance_result(backend: BackendRef, rule_name: str, nproc: int = 2) -> RuleResult:
    rule = rule_named(rule_name)
    if rule.multi_process:
        return _multi_process_results(backend, nproc)[rule_name]
    return run_rule(resolve(backend), rule)


def report(result: RuleResult) -> None:
    """Turn a rule's result into pytest's outcome: skip with why, or fail with which rule broke and how."""
    if result.status == "skipped":
        pytest.skip(f"{result.rule}: {result.detail}")
    if result.status == "failed":
        pytest.fail(f"conformance rule '{result.rule}' broke: {result.detail}", pytrace=False)


class BackendConformance:
    """Subclass in a test module and set ``backend`` (a registered name or a ``DeviceBackend`` instance)."""

    backend: BackendRef | None = None
    nproc: int = 2

    def pytest_generate_tests(self, metafunc):
        # At collection time, so the rules plugins register (the engine's) are known.
        if "rule" in metafunc.fixturenames:
            metafunc.parametrize("rule", rule_names())

    def test_conformance(self, rule, request):
        backend = self.backend or request.config.getoption("accel_backend", default=None)
        if backend is None:
            pytest.fail(f"{type(self).__name__} names no backend: set its `backend` attribute or pass "
                        "--accel-backend NAME with -p accel_backends.testing", pytrace=False)
        report(conformance_result(backend, rule, self.nproc))


class ConformanceItem(pytest.Item):
    def __init__(self, *, rule: str, backend: str, nproc: int, **kwargs):
        super().__init__(**kwargs)
        self.rule, self.backend, self.nproc = rule, backend, nproc

    def runtest(self) -> None:
        report(conformance_result(self.backend, self.rule, self.nproc))

    def reportinfo(self):
        return Path(__file__), None, f"accel_backends conformance [{self.backend}] {self.rule}"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("accel_backends", "accel_backends conformance kit")
    group.addoption("--accel-backend", dest="accel_backend", default=None, metavar="NAME",
                    help="run the conformance kit against the registered backend NAME")
    group.addoption("--accel-nproc", dest="accel_nproc", type=int, default=2,
                    help="processes for the kit's multi-process rules (default 2)")


def pytest_collection_modifyitems(session, config, items) -> None:
    name = config.getoption("accel_backend")
    if not name:
        return
    nproc = config.getoption("accel_nproc")
    for rule in rule_names():
        items.append(ConformanceItem.from_parent(session, name=f"conformance[{name}-{rule}]", rule=rule,
                                                 backend=name, nproc=nproc))
