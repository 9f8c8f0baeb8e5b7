"""``accel-backends info`` reads like ``list``: memory in GiB, and nothing printed for a value the backend does
not have (no ``replaced None``, ``reason None`` or raw byte dicts)."""

import re

from accel_backends import cli

GIB = 2**30


def test_absent_values_print_nothing_and_memory_is_in_gib():
    lines = cli.info_lines({"name": "cpu", "replaced": None, "available": True, "reason": None,
                            "memory": {"allocated": GIB // 2, "reserved": None, "peak_allocated": GIB,
                                       "total": 24 * GIB, "free": 20 * GIB}})
    memory = "total 24.0 GiB, free 20.0 GiB, allocated 0.5 GiB, peak allocated 1.0 GiB"
    assert lines == ["name                     cpu", "available                True",
                     f"memory                   {memory}"]


def test_present_values_and_unreadable_memory_are_printed():
    lines = cli.info_lines({"replaced": "cpu", "reason": "no device", "memory": {"error": "RuntimeError: busy"}})
    assert lines == ["replaced                 cpu", "reason                   no device",
                     "memory                   unreadable (RuntimeError: busy)"]
    assert cli.info_lines({"memory": {"total": None, "free": None}}) == []


def test_info_of_this_machines_backend(capsys):
    assert cli.main(["info", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "{" not in out
    assert re.search(r"^memory\s+total \d+\.\d GiB, free \d+\.\d GiB", out, re.M), out
    assert cli.main(["info", "npu"]) == 0  # unavailable here: its reason, no device figures
    out = capsys.readouterr().out
    assert re.search(r"^reason\s+torch_npu", out, re.M) and not re.search(r"\bNone\b|^memory", out, re.M)
