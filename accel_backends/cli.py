"""``accel-backends``: what is registered, what can run here, and why not; ``smoke`` checks a torchrun job's
collectives across ranks and nodes (``accel_backends/smoke.py``); ``certify`` prints the report card for on-policy
RL on a backend (``accel_backends/testing/certify.py``).

It runs where ``import torch`` itself fails in torch's device-backend autoload (a vendor package that cannot load):
it then runs again with that autoload off (``accel_backends.torch_import``) and starts its report with what broke
and how to fix it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import warnings

from . import smoke
from .errors import AccelBackendError
from .registry import BACKEND_ENV, PluginLoadWarning, registry, safe_reason
from .torch_import import AUTOLOAD_ENV, describe, reported_failure

# The torch minor versions CI tests, oldest and newest (pyproject.toml's range and docs/hardware.md agree).
TESTED_TORCH = ((2, 10), (2, 13))


def torch_version_check(version: str) -> dict:
    """``version`` (a torch version string) against the tested range, with a warning when outside it."""
    low, high = TESTED_TORCH
    tested = f"{low[0]}.{low[1]} to {high[0]}.{high[1]}"
    match = re.match(r"(\d+)\.(\d+)", version)
    minor = (int(match[1]), int(match[2])) if match else None
    inside = minor is not None and low <= minor <= high
    doc = {"version": version, "tested_range": tested, "in_tested_range": inside}
    if not inside:
        doc["warning"] = (f"torch {version} is outside the tested range {tested}: FSDP2 details this project relies "
                          f"on differ between torch versions (torch 2.8 gives wrong FSDP2 gradients on the CPU); "
                          f"install a torch in the range, e.g. pip install 'torch>={low[0]}.{low[1]},"
                          f"<{high[0]}.{high[1] + 1}'")
    return doc


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _memory(backend, available: bool) -> dict | None:
    if not available:
        return None
    try:
        return backend.memory_stats().as_dict()
    except Exception as exc:  # noqa: BLE001 - diagnostics report, never crash
        return {"error": f"{type(exc).__name__}: {exc}"}


def _selection() -> dict:
    env_value = os.environ.get(BACKEND_ENV)
    try:
        selected, error = registry().select().name, None
    except AccelBackendError as exc:
        selected, error = None, str(exc)
    return {"selected": selected, "requested": env_value, "selection_error": error}


def autoload_report() -> dict | None:
    """When this run started because ``import torch`` failed in torch's device-backend autoload: the failure,
    its description and each backend's advice (``DeviceBackend.explain_autoload_failure``); else ``None``."""
    failure = reported_failure()
    if failure is None:
        return None
    advice = {}
    for name, record in registry().records().items():
        try:
            text = record.backend.explain_autoload_failure(failure)
        except Exception as exc:  # noqa: BLE001 - diagnostics report, never crash
            text = f"(its advice failed: {type(exc).__name__}: {exc})"
        if text:
            advice[name] = text
    if not advice:
        advice["any"] = ("fix or uninstall the package that declares that entry point; programs importing torch "
                         f"can run meanwhile with {AUTOLOAD_ENV}=0")
    return {**failure, "description": describe(failure), "advice": advice}


def _print_autoload_report(report: dict | None) -> None:
    if report is None:
        return
    print(f"accel-backends: {report['description']}")
    for name, text in report["advice"].items():
        print(f"  fix ({name}): {text}")
    print(f"  (this report ran with {AUTOLOAD_ENV}=0; until fixed, other programs that import torch here need it "
          "too)\n")


def collect() -> dict:
    """Everything ``list`` prints, as plain data (the ``--json`` document)."""
    reg = registry()
    backends = []
    for info in reg.infos():
        row = dataclasses.asdict(info)
        row["memory"] = _memory(reg.get(info.name).backend, info.available)
        backends.append(row)
    return {
        "backends": backends,
        **_selection(),
        "failed_plugins": [dataclasses.asdict(f) for f in reg.failures],
        "torch_autoload_failure": autoload_report(),
    }


def _print_table(doc: dict) -> None:
    _print_autoload_report(doc["torch_autoload_failure"])
    header = ("NAME", "STATUS", "PRIO", "DEVICE", "COUNT", "DIST", "MEM GiB total/free", "PLUGIN")
    rows = []
    for b in doc["backends"]:
        mem = b["memory"] or {}
        memory = f"{_gib(mem.get('total'))}/{_gib(mem.get('free'))}" if b["available"] else "-"
        plugin = b["plugin"] + (f" (replaces {b['replaced']})" if b["replaced"] else "")
        status = "available" if b["available"] else "unavailable"
        rows.append((b["name"], status, str(b["priority"]), b["device_type"], str(b["device_count"]),
                     b["dist_backend"], memory, plugin))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    reasons = [(b["name"], b["reason"]) for b in doc["backends"] if not b["available"]]
    if reasons:
        print("\nwhy not:")
        for name, reason in reasons:
            print(f"  {name}: {reason}")
    if doc["failed_plugins"]:
        print("\nplugins that failed to load:")
        for f in doc["failed_plugins"]:
            print(f"  {f['plugin']} ({f['distribution']}): {f['error']}")
    print()
    if doc["selected"]:
        how = f"{BACKEND_ENV}={doc['requested']}" if doc["requested"] else "auto-detected"
        print(f"selected: {doc['selected']} ({how})")
    else:
        print(f"selected: none: {doc['selection_error']}")


def _info(name: str | None) -> dict:
    reg = registry()
    backend = reg.select(name) if name is None else reg.get(name).backend
    record = reg.get(backend.name)
    reason = safe_reason(backend)
    import torch

    doc = {
        "torch": torch_version_check(torch.__version__),
        "name": backend.name,
        "class": f"{type(backend).__module__}.{type(backend).__qualname__}",
        "plugin": record.plugin,
        "replaced": record.replaced,
        "available": reason is None,
        "reason": reason,
        "priority": backend.priority,
        "device_type": backend.device_type,
        "dist_backend": backend.dist_backend,
        "visible_devices_env": backend.visible_devices_env,
        "visible_devices": os.environ.get(backend.visible_devices_env) if backend.visible_devices_env else None,
        "supports_pinned_memory": backend.supports_pinned_memory,
    }
    if reason is None:
        doc["device_count"] = backend.device_count()
        doc["device"] = str(backend.device())
        doc["memory"] = _memory(backend, True)
    try:  # a figure the backend could not find (e.g. no CANN version) is left out, not printed as None
        doc["versions"] = {key: value for key, value in backend.describe().items() if value is not None}
    except Exception as exc:  # noqa: BLE001
        doc["versions"] = {"error": f"{type(exc).__name__}: {exc}"}
    doc["torch_autoload_failure"] = autoload_report()
    return doc


MEMORY_FIGURES = (("total", "total"), ("free", "free"), ("allocated", "allocated"), ("reserved", "reserved"),
                  ("peak_allocated", "peak allocated"))


def memory_text(memory: dict | None) -> str | None:
    """``memory_stats()`` as ``list`` shows memory: GiB, only the figures this backend has; None when it has none."""
    if not memory:
        return None
    if "error" in memory:
        return f"unreadable ({memory['error']})"
    figures = [f"{label} {_gib(memory[key])} GiB" for key, label in MEMORY_FIGURES if memory.get(key) is not None]
    return ", ".join(figures) or None


def info_lines(doc: dict) -> list[str]:
    """``info``'s text: one ``key value`` line per figure this backend has (absent ones print nothing)."""
    lines = []
    for key, value in doc.items():
        if key == "memory":
            value = memory_text(value)
        if value is not None:
            lines.append(f"{key:24} {value}")
    return lines


def _print_versions(versions: dict) -> None:
    """``describe()``'s figures, one per line; a list of devices one device per line."""
    for key, value in versions.items():
        if key == "torch":
            continue  # printed above
        if isinstance(value, list) and value and isinstance(value[0], dict):
            print(f"{key:24} {len(value)}")
            for row in value:
                print(f"{'':24}   " + ", ".join(f"{k} {v}" for k, v in row.items()))
        elif isinstance(value, dict):
            print(f"{key:24} {'(none set)' if not value else ''}".rstrip())
            for name, setting in value.items():
                print(f"{'':24}   {name}={setting}")
        else:
            print(f"{key:24} {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accel-backends", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    list_parser = sub.add_parser("list", help="every registered backend and whether it can run here")
    list_parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    info_parser = sub.add_parser("info", help="one backend in detail (default: the one that would be selected)")
    info_parser.add_argument("name", nargs="?")
    info_parser.add_argument("--json", action="store_true")
    smoke_parser = sub.add_parser("smoke", help="under torchrun on every node: all-reduce checks, bus bandwidth, "
                                                "hosts and devices of every rank")
    smoke.add_arguments(smoke_parser)
    certify_parser = sub.add_parser("certify", help="the report card for on-policy RL on a backend: each property "
                                                    "RL depends on, with its figure and verdict")
    certify_parser.add_argument("name", help="the registered backend to certify (see `accel-backends list`)")
    certify_parser.add_argument("--nproc", type=int, default=None,
                                help="processes of the job (default 2; 1 for the rollout card)")
    certify_parser.add_argument("--json", default=None, metavar="PATH", help="also write the card as JSON")
    certify_parser.add_argument("--timeout", type=float, default=600.0, help="seconds the job may take (default 600)")
    certify_parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                                help="the engine's mixed precision for the card (default fp32; GPU/NPU runs are bf16)")
    certify_parser.add_argument("--rollout", default=None, metavar="ENGINE",
                                help="the rollout card of a rollout engine instead (hf, hf-continuous, vllm, "
                                     "vllm-server): sleep / wake, memory, prefix cache, weight versions, log-prob gap")
    args = parser.parse_args(argv)
    if args.command == "certify" and args.nproc is None:
        args.nproc = 1 if args.rollout else 2
    if args.command == "certify" and args.nproc < 1:
        parser.error(f"--nproc must be at least 1, got {args.nproc}")

    # Load failures are part of the output here; keep the warning text out of it.
    warnings.simplefilter("ignore", PluginLoadWarning)
    try:
        if args.command == "smoke":
            return smoke.run(args)
        if args.command == "certify":
            from .testing import certify

            return certify.main(args)
        if args.command == "list":
            doc = collect()
            if args.json:
                print(json.dumps(doc, indent=2))
            else:
                _print_table(doc)
        else:
            doc = _info(args.name)
            torch_doc = doc["torch"]
            if args.json:
                print(json.dumps(doc, indent=2))
            else:
                _print_autoload_report(doc.pop("torch_autoload_failure"))
                doc["torch"] = f"{torch_doc['version']} (tested: {torch_doc['tested_range']})"
                versions = doc.pop("versions")
                print("\n".join(info_lines(doc)))
                _print_versions(versions)
            if "warning" in torch_doc:
                print(f"accel-backends: warning: {torch_doc['warning']}", file=sys.stderr)
    except AccelBackendError as exc:
        print(f"accel-backends: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
