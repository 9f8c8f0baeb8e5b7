"""accel_backends/smoke.py: the cross-node smoke test's pure parts and its refusal to run without torchrun."""

import argparse

import pytest

from accel_backends import smoke
from accel_backends.backends.cpu import CPUBackend


def _args(**overrides):
    parser = argparse.ArgumentParser()
    smoke.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_without_torchrun_it_says_how_to_run_it(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(smoke.SmokeError, match=r"not started by torchrun .*torchrun --nnodes 2 .*-m accel_backends "
                                               r"smoke"):
        smoke.run(_args())


def test_the_command_line_turns_it_into_one_line_and_exit_2(monkeypatch, capsys):
    from accel_backends import cli

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert cli.main(["smoke", "--size-mb", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("accel-backends: error: not started by torchrun") and "\n" not in err


def test_bus_bandwidth_is_nccl_tests_formula():
    # 1 GB in 1 s on 8 ranks: algorithm bandwidth 1 GB/s, bus bandwidth x 2 * 7 / 8
    assert smoke.bus_bandwidth(10**9, 1.0, 8) == pytest.approx(1.75)
    assert smoke.bus_bandwidth(10**9, 0.5, 2) == pytest.approx(2.0)
    assert smoke.bus_bandwidth(10**9, 1.0, 1) == 0.0


def test_hosts_table_groups_ranks_by_host_in_rank_order():
    labels = ["b|dev:0", "b|dev:1", "a|dev:0", "a|dev:1", "b|dev:2"]
    assert smoke.hosts_table(labels) == [("b", [0, 1, 4], ["dev:0", "dev:1", "dev:2"]),
                                         ("a", [2, 3], ["dev:0", "dev:1"])]


def test_report_gives_a_table_and_a_verdict_that_can_fail():
    labels = [f"node{r // 2}|dev:{r % 2}" for r in range(4)]
    results = {"join_s": 0.5, "small_ok": True, "large_ok": True, "allreduce_s": 0.01, "bus_gbps": 12.5}
    text = smoke.report(CPUBackend(), labels, results, _args(size_mb=64.0, iters=5), 10.0)
    assert "4 ranks on 2 host(s)" in text
    assert [line.split() for line in text.splitlines() if line.startswith("node")] == [
        ["node0", "0-1", "2", "dev:0", "dev:1"], ["node1", "2-3", "2", "dev:0", "dev:1"]]
    assert "bus bandwidth 12.50 GB/s" in text and text.splitlines()[-1].startswith("verdict: OK")
    broken = smoke.report(CPUBackend(), labels, {**results, "large_ok": False}, _args(), 10.0)
    assert broken.splitlines()[-1] == "verdict: FAILED (large all-reduce gave a wrong sum)"
