"""The conformance kit: checks that a device backend keeps the ``accel_backends`` contract.

    python -m accel_backends.testing NAME [--nproc 2]          # one line per rule, exit 0 when all hold
    pytest -p accel_backends.testing --accel-backend NAME      # the same rules as pytest items
    results = accel_backends.testing.run_conformance("NAME")   # from Python

``strict`` (``strict.py``) is a stand-in accelerator on the CPU that keeps a real device's rules (deferred host
copies, pinned memory, declared reduction dtypes), for the project's tests and for a plugin author's.

``RULES`` and ``RULE_NAMES`` are the device rules followed by those plugins register (the engine's), found when
first read. See ``docs/plugins.md`` for the rules and how to use the kit while writing a backend.
"""

import sys

from .kit import RuleResult, all_rules, rule_named, rule_names, run_conformance
from .rules import DEVICE_RULES, Rule, RuleSkipped, raw_bytes, require

__all__ = ["DEVICE_RULES", "RULES", "RULE_NAMES", "Rule", "RuleResult", "RuleSkipped", "all_rules", "raw_bytes",
           "require", "rule_named", "rule_names", "run_conformance"]


def __getattr__(name: str):
    # Computed when read: the rules of plugins (the engine's) are known only once the registry has loaded them.
    if name == "RULES":
        return all_rules()
    if name == "RULE_NAMES":
        return rule_names()
    if name == "BackendConformance":  # imported outside a pytest run (pytest is then imported here)
        from .pytest_plugin import BackendConformance

        return BackendConformance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The pytest plugin's hooks where pytest runs (``-p accel_backends.testing`` imports this module from pytest). Not
# otherwise: the strict stand-in (``strict.py``) lives here and loads in every process, and importing pytest costs
# a third of a second.
if "pytest" in sys.modules:
    from .pytest_plugin import BackendConformance, pytest_addoption, pytest_collection_modifyitems  # noqa: F401

__all__ += ["BackendConformance"]
