"""The trace plugin, installed from plugins/accel-trace, on a real 2-process engine job: what its files hold."""

import json
from pathlib import Path

import pytest
from conftest import run_python
from distributed import run_ranks
from engine_checks import CopyingCPUBackend

pytestmark = pytest.mark.slow


class FailingOnloadBackend(CopyingCPUBackend):
    """TEST STAND-IN: copies like a device would, and fails moves to the device while ``fail`` is set."""

    name = "cpu-failing-onload"
    fail = False

    def to_device(self, tensor, non_blocking=False):
        if self.fail:
            raise RuntimeError("device out of memory (injected)")
        return super().to_device(tensor, non_blocking)


def _traced_job(rank, site):
    import sys

    sys.path.insert(0, site)  # the installed plugin is found through its entry point, as in a user's job
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    from accel_backends.backends.cpu import CPUBackend
    from engine import EngineConfig, FSDPEngine

    batches = make_micro_batches(seed=rank, count=2)
    plain = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2), backend=CPUBackend())
    for _ in range(2):
        with plain.train_mode():
            plain.forward_backward_batch(batches, token_loss)
            plain.optimizer_step()
        with plain.eval_mode():
            plain.forward_backward_batch(batches, token_loss, forward_only=True)

    backend = FailingOnloadBackend()
    offloaded = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2, param_offload=True, optimizer_offload=True),
                           backend=backend)
    with offloaded.train_mode():
        offloaded.forward_backward_batch(batches, token_loss)
        offloaded.optimizer_step()
    backend.fail = True
    try:
        with offloaded.eval_mode():
            raise AssertionError("the onload should have failed")
    except RuntimeError as exc:
        assert "injected" in str(exc)
    return True


@pytest.fixture(scope="module")
def trace_dir(plugin_site, tmp_path_factory):
    directory = tmp_path_factory.mktemp("trace")
    run_ranks(_traced_job, plugin_site, env={"ACCEL_TRACE_DIR": str(directory)})
    return directory


def _load(directory: Path, rank: int):
    trace = json.loads((directory / f"trace-rank{rank}.json").read_text())
    steps = json.loads((directory / f"steps-rank{rank}.json").read_text())
    return trace["traceEvents"], steps


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_writes_a_chrome_trace(trace_dir, rank):
    events, _ = _load(trace_dir, rank)
    assert all({"ph", "pid", "name"} <= set(e) for e in events) and {e["pid"] for e in events} == {rank}
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {f"rank {rank}", "engine 1 (cpu)", "engine 2 (cpu-failing-onload)"}
    timed = [e for e in events if e["ph"] != "M"]
    assert all(isinstance(e["ts"], float) for e in timed)
    memory = [e for e in timed if e["ph"] == "C"]
    assert memory and all(e["args"]["allocated_gib"] > 0 for e in memory)


def test_no_offload_gives_one_event_per_mode_switch_and_no_move(trace_dir):
    events, steps = _load(trace_dir, 0)
    plain = [e for e in events if e.get("tid") == 1 and e["ph"] != "M"]
    modes = [(e["name"], e["ph"]) for e in plain if e.get("cat") == "mode"]
    assert modes == [("train_mode", "B"), ("train_mode", "E"), ("eval_mode", "B"), ("eval_mode", "E")] * 2
    assert not [e for e in plain if e.get("cat") == "move"]
    step_events = [e for e in plain if e["name"] == "optimizer_step"]
    assert [e["args"]["step"] for e in step_events] == [1, 2]
    assert all(e["args"]["grad_norm"] > 0 and e["args"]["skipped"] is False for e in step_events)
    plain_steps = [s for s in steps if s["engine"] == 1]
    assert [s["step"] for s in plain_steps] == [1, 2]
    assert all(s["train_mode_s"] > 0 and "moves" not in s for s in plain_steps)
    assert plain_steps[1]["eval_mode_s"] > 0  # the eval pass between the two steps


def test_offload_moves_carry_bytes_and_a_failed_onload_still_closes_its_mode(trace_dir):
    events, steps = _load(trace_dir, 1)
    offloaded = [e for e in events if e.get("tid") == 2 and e["ph"] != "M"]
    moves = [(e["args"]["what"], e["args"]["destination"], e["args"]["bytes"]) for e in offloaded
             if e.get("cat") == "move"]
    kinds = [(what, where) for what, where, _ in moves]
    assert kinds[:4] == [("params", "cpu"), ("optimizer", "cpu"), ("params", "device"), ("optimizer", "device")]
    assert ("params", "cpu") in kinds[4:] and ("optimizer", "cpu") in kinds[4:]
    assert all(num_bytes > 0 for what, _, num_bytes in moves if what == "params")
    modes = [(e["name"], e["ph"]) for e in offloaded if e.get("cat") == "mode"]
    assert modes == [("train_mode", "B"), ("train_mode", "E"), ("eval_mode", "B"), ("eval_mode", "E")]
    (step,) = [s for s in steps if s["engine"] == 2]
    assert step["moves"] >= 4 and step["bytes_to_device"] > 0 and step["bytes_to_cpu"] > 0


def test_listing_backends_with_the_trace_plugin_installed_does_not_import_the_engine(plugin_site):
    code = "import sys, accel_backends; accel_backends.list_backends(); print('engine' in sys.modules)"
    assert run_python(code, env={"PYTHONPATH": plugin_site}, check=True).stdout.split() == ["False"]


def test_a_timed_move_is_a_span_ending_when_reported(tmp_path):
    import importlib.util
    import types

    from conftest import REPO

    source = REPO / "plugins" / "accel-trace" / "accel_trace" / "timeline.py"
    spec = importlib.util.spec_from_file_location("accel_trace_timeline_under_test", source)
    timeline_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline_module)
    engine = types.SimpleNamespace(rank=0, backend=None)  # no backend: no memory samples, no failure
    timeline = timeline_module.Timeline(str(tmp_path), rank=0)
    timeline.transfer(engine, "params", "device", 4096, seconds=0.25)
    timeline.optimizer_step(engine, 1, {"grad_norm": float("nan"), "skipped": True})
    events, steps = _load(tmp_path, 0)
    (move,) = [e for e in events if e.get("cat") == "move"]
    assert move["ph"] == "X" and move["dur"] == 250000.0 and move["args"]["bytes"] == 4096
    (step,) = steps
    assert step["move_s"] == 0.25 and step["bytes_to_device"] == 4096 and step["grad_norm"] == "nan"
