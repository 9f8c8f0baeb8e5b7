"""The conformance kit: checks that a device backend keeps the ``accel_backends`` contract.

    python -m accel_backends.testing NAME [--nproc 2]          # one line per rule, exit 0 when all hold
    pytest -p accel_backends.testing --accel-backend NAME      # the same rules as pytest items
    results = accel_backends.testing.run_conformance("NAME")   # from Python

``RULES`` and ``RULE_NAMES`` are the device rules followed by those plugins register (the engine's), found when
first read. See ``docs/plugins.md`` for the rules and how to use the kit while writing a backend.
"""

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
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


try:  # the pytest plugin and BackendConformance exist where pytest does; the command line needs no pytest
    import pytest  # noqa: F401
except ImportError:
    pass
else:
    from .pytest_plugin import BackendConformance, pytest_addoption, pytest_collection_modifyitems  # noqa: F401

    __all__ += ["BackendConformance"]
