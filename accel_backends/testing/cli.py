"""The kit's command line: one line per rule, exit 0 only when every applicable rule holds."""

from __future__ import annotations

import argparse
import sys

from ..errors import AccelBackendError
from ..registry import registry
from .kit import DEFAULT_TIMEOUT_S, all_rules, run_conformance


def parse_args(argv):
    rules = all_rules()
    parser = argparse.ArgumentParser(
        prog="python -m accel_backends.testing",
        description="Check a registered device backend against the accel_backends contract.",
        epilog="rules: " + "; ".join(f"{r.name}: {r.summary}" for r in rules),
    )
    parser.add_argument("name", help="the registered backend to check (see `accel-backends list`)")
    parser.add_argument("--nproc", type=int, default=2, help="processes for the multi-process rules (default 2)")
    parser.add_argument("--rule", action="append", dest="rules", choices=[r.name for r in rules], metavar="RULE",
                        help="run only this rule (repeatable); default: all")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds the multi-process job may take (default {DEFAULT_TIMEOUT_S:.0f})")
    args = parser.parse_args(argv)
    if args.nproc < 1:
        parser.error(f"--nproc must be at least 1, got {args.nproc}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        record = registry().get(args.name)
        print(f"conformance of backend '{record.backend.name}' ({type(record.backend).__module__}."
              f"{type(record.backend).__qualname__}, from {record.plugin}), {args.nproc} process(es)", flush=True)
        results = run_conformance(args.name, nproc=args.nproc, rules=args.rules, timeout=args.timeout,
                                  on_result=lambda result: print(result.line(), flush=True))
    except (AccelBackendError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = {status: sum(r.status == status for r in results) for status in ("passed", "failed", "skipped")}
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0 if counts["failed"] == 0 else 1
