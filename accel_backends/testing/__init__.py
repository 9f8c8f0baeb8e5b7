"""The conformance kit: checks that a device backend keeps the ``accel_backends`` contract.

    python -m accel_backends.testing NAME [--nproc 2]          # one line per rule, exit 0 when all hold
    pytest -p accel_backends.testing --accel-backend NAME      # the same rules as pytest items
    results = accel_backends.testing.run_conformance("NAME")   # from Python

See ``docs/plugins.md`` for the rules and how to use the kit while writing a backend.
"""

from .kit import RuleResult, run_conformance
from .rules import RULE_NAMES, RULES, Rule, RuleSkipped

__all__ = ["RULES", "RULE_NAMES", "Rule", "RuleResult", "RuleSkipped", "run_conformance"]

try:  # the pytest plugin and BackendConformance exist where pytest does; the command line needs no pytest
    import pytest  # noqa: F401
except ImportError:
    pass
else:
    from .pytest_plugin import BackendConformance, pytest_addoption, pytest_collection_modifyitems  # noqa: F401

    __all__ += ["BackendConformance"]
