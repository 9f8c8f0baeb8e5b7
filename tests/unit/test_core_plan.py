"""``rollout.vllm.borrow_threads=auto`` (engine/rollout/vllm_server/cores.py): borrowing, and the cores of the
servers and the trainer, only for servers this run starts on the trainer's host when the backend computes on host
threads; off for remote servers and on devices (stand-in backends: a device plugin, a host plugin, the built-ins).
What a plan places is applied for real here: a server's guard binds it, a trainer process binds its threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from accel_backends import DeviceBackend
from accel_backends.backends.cpu import CPUBackend
from accel_backends.backends.cuda import CUDABackend
from accel_backends.backends.npu import NPUBackend
from accel_backends.testing.rules import check_attributes
from engine.rollout.borrowing import borrow_idle_cores, shown_borrowing
from engine.rollout.engines.vllm_settings import VLLMConfig
from engine.rollout.vllm_server import cores as core_plans
from engine.rollout.vllm_server import guard
from engine.rollout.vllm_server.cores import CorePlan, core_plan
from engine.rollout.vllm_server.manager import ServerManager
from engine.rollout.vllm_server.plan import server_options, server_specs
from engine.runtime.borrowed_threads import process_cores

CPU = CPUBackend()
GLOO = CPU.inference_engine_facts()


class MyDevice(DeviceBackend):
    """A third-party accelerator plugin: it computes on its device (the base class's default)."""

    name, device_type = "mydevice", "cpu"


class MyHostDevice(CPUBackend):
    """A plugin that runs on the host: it inherits the CPU backend's host threads."""

    name = "myhost"


def _plan(backend=CPU, cores=(0, 1), processes=1, binding=None, **fields):
    settings = VLLMConfig(**{"mode": "server", **fields})
    return core_plan(settings, backend.computes_on_host_threads, backend.name, list(cores), processes,
                     binding=binding)


def test_the_backend_says_whether_the_trainer_computes_on_host_threads():
    assert CPUBackend.computes_on_host_threads and MyHostDevice.computes_on_host_threads
    assert not CUDABackend.computes_on_host_threads and not NPUBackend.computes_on_host_threads
    assert not DeviceBackend.computes_on_host_threads  # a device plugin computes on its device unless it says so
    check_attributes(MyHostDevice())

    class Wordy(CPUBackend):
        name, computes_on_host_threads = "wordy", "yes"

    with pytest.raises(AssertionError, match="`computes_on_host_threads` must be a bool"):
        check_attributes(Wordy())


@pytest.mark.parametrize("backend", [CPUBackend(), MyHostDevice()], ids=["cpu", "host-plugin"])
def test_auto_borrows_a_local_servers_cores_on_host_threads(backend):
    plan = _plan(backend, binding="lend")
    assert (plan.borrow, plan.server_cores, plan.server_threads) == (1, ((1,),), 1)
    assert (plan.trainer_cores, plan.trainer_threads, plan.binding) == ((0,), 1, "lend")
    assert plan.why == ("auto: 1, the 1 local server(s) on core(s) 1, the 1 trainer process(es) on 0 with 1 "
                        "thread(s) each, each adding 1 of the servers' cores while they idle (lend)")
    assert plan.bound_cores(0) is None  # lend: the trainer's affinity is left alone
    wide = core_plan(VLLMConfig(mode="server"), True, "cpu", list(range(8)), 2, omp_threads=1, binding="split")
    # 8 cores, one share each for 2 trainer processes and 1 server: the server on the last 2, the trainer on 6.
    assert wide.server_cores == ((6, 7),) and wide.server_threads == 2 and wide.trainer_cores == (0, 1, 2, 3, 4, 5)
    assert wide.trainer_threads == 1 and wide.borrow == 1  # OMP_NUM_THREADS=1 caps the trainer's own threads
    assert wide.bound_cores(0) == ({0, 1, 2}, {0, 1, 2, 6}) and wide.bound_cores(1) == ({3, 4, 5}, {3, 4, 5, 7})
    two = core_plan(VLLMConfig(mode="server", servers=2, tensor_parallel_size=2), True, "cpu", list(range(12)), 2)
    assert two.server_cores == ((4, 5, 6, 7), (8, 9, 10, 11)) and two.server_threads == 2  # 2 cores per worker
    assert two.trainer_cores == (0, 1, 2, 3) and two.trainer_threads == 2 and two.borrow == 4


@pytest.mark.parametrize("backend", [CUDABackend(), NPUBackend(), MyDevice()],
                         ids=["nvidia-gpu", "ascend-npu", "device-plugin"])
def test_auto_does_not_borrow_on_devices(backend):
    plan = _plan(backend)
    assert plan == CorePlan(0, f"auto: 0, the trainer computes on the device (backend {backend.name}), not on "
                               "host threads")
    options = server_options(VLLMConfig(mode="server"), backend.inference_engine_facts(), "bfloat16", "auto", 96)
    (spec,) = server_specs(VLLMConfig(mode="server"), backend.inference_engine_facts(), None, options, lambda: 1,
                           plan)
    assert spec.cores == [] and "OMP_NUM_THREADS" not in spec.env  # the server is not placed either


def test_auto_does_not_borrow_from_remote_servers_colocated_engines_or_too_few_cores():
    remote = _plan(server_urls=["http://other-host:8000"])
    assert remote.borrow == 0 and remote.server_cores == () and "servers are remote" in remote.why
    assert core_plan(VLLMConfig(), True, "cpu", [0, 1], 1).why == ("auto: 0, the engine is colocated (no server "
                                                                   "to borrow from)")
    crowded = _plan(processes=2)  # 2 trainer processes and a server on 2 cores: no core of its own for each
    assert crowded.borrow == 0 and crowded.trainer_threads is None and "cannot give each of the 2 trainer" in \
        crowded.why
    spread = core_plan(VLLMConfig(mode="server"), True, "cpu", list(range(8)), 1, hosts=2)
    assert spread.borrow == 0 and "spans 2 hosts" in spread.why
    few = _plan(cores=(0, 1, 2), processes=2)  # a core each, but the server's one does not go round two
    assert few.borrow == 0 and few.server_cores == ((2,),) and few.trainer_threads == 1
    assert "do not go round the 2 trainer processes" in few.why


def test_a_number_keeps_its_meaning_without_binding():
    for value, why in [(1, "set: 1 thread(s) while the servers idle"), (0, "set: never borrow")]:
        assert _plan(borrow_threads=value) == CorePlan(value, why)
        assert _plan(CUDABackend(), borrow_threads=value).borrow == value  # as asked, on any device


def test_the_plan_places_the_servers_and_the_guard_binds_them(tmp_path):
    plan = _plan(binding="lend")
    settings = VLLMConfig(mode="server", kv_cache_gib=1.0)
    options = server_options(settings, GLOO, "float32", "auto", 96)
    (spec,) = server_specs(settings, GLOO, None, options, lambda: 30000, plan)
    assert spec.cores == [1] and spec.env["OMP_NUM_THREADS"] == "1"
    (unplaced,) = server_specs(settings, GLOO, None, options, lambda: 30000)
    assert unplaced.cores == [] and "OMP_NUM_THREADS" not in unplaced.env
    command = ServerManager(tmp_path, [spec], tmp_path).command(spec)
    assert command[3:7] == [str(os.getpid()), "--cores", "1", "--"]
    core = min(process_cores())
    # The guard's file as a script: the same code, without importing the package (torch) first.
    shown = subprocess.run([sys.executable, guard.__file__, str(os.getpid()), "--cores",
                            str(core), "--", "grep", "Cpus_allowed_list", "/proc/self/status"],
                           capture_output=True, text=True, timeout=60, start_new_session=True)  # it ends its group
    assert shown.stdout.split() == ["Cpus_allowed_list:", str(core)], shown.stderr


class _Engine:
    def __init__(self, plan):
        self.core_plan = plan


@pytest.fixture
def restored():
    threads, cores = torch.get_num_threads(), process_cores()
    yield
    torch.set_num_threads(threads)
    os.sched_setaffinity(0, cores)


@pytest.mark.skipif(len(process_cores() or ()) < 2, reason="needs 2 cores")
def test_a_trainer_process_computes_on_its_share_and_borrows_while_the_servers_idle(restored, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    first, last = min(process_cores()), max(process_cores())
    found = torch.get_num_threads()
    state = {"busy": True}
    lend = CorePlan(1, "auto", ((last,),), 1, (first,), 1, 1, "lend")
    borrowing = borrow_idle_cores(_Engine(lend), lambda: state["busy"])
    assert torch.get_num_threads() == 1 and borrowing.cores is None  # its own share while the server samples
    state["busy"] = False
    torch.nn.Linear(2, 2)(torch.zeros(1, 2))  # the next module looks again
    assert torch.get_num_threads() == 2
    borrowing.stop()
    assert torch.get_num_threads() == found
    state["busy"] = True
    split = borrow_idle_cores(_Engine(CorePlan(1, "auto", ((last,),), 1, (first,), 1, 1, "split")),
                              lambda: state["busy"])
    assert process_cores() == {first} and torch.get_num_threads() == 1  # every thread kept off the server's core
    state["busy"] = False
    torch.nn.Linear(2, 2)(torch.zeros(1, 2))
    assert process_cores() == {first, last} and torch.get_num_threads() == 2
    split.stop()
    assert borrow_idle_cores(_Engine(CorePlan(0, "set: never borrow")), lambda: False) is None
    assert borrow_idle_cores(object(), lambda: False) is None  # an engine without a plan (hf, colocated vLLM)


def test_print_config_shows_what_auto_chose_and_why(monkeypatch):
    from engine.rl.algorithms.grpo.config import build_config, resolved

    monkeypatch.setattr(core_plans, "allowed_cores", lambda: [0, 1])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(core_plans.BINDING_ENV, raising=False)
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    config = build_config(None, None, ["rollout.engine=vllm", "rollout.vllm.mode=server", "rollout.vllm.servers=1",
                                     "rollout.max_staleness=1"])
    shown = resolved(config, 1)
    assert shown["rollout"]["vllm"]["borrow_threads"] == "auto"  # the option as set: a resume decides again
    assert shown["derived"]["borrow_threads"] == {
        "threads": 1, "why": "auto: 1, the 1 local server(s) on core(s) 1, the 1 trainer process(es) on 0 with 1 "
                             "thread(s) each, each adding 1 of the servers' cores while they idle (lend)",
        "server_cores": [[1]], "server_threads": 1, "trainer_cores": [0], "trainer_threads": 1, "binding": "lend"}
    assert resolved(config, 2)["derived"]["borrow_threads"]["threads"] == 0  # no core of its own for 3 processes
    assert shown_borrowing(config.rollout, 1)["binding"] == "lend"
    config.rollout.vllm.mode = "colocate"
    assert shown_borrowing(config.rollout, 1) is None and "borrow_threads" not in resolved(config, 1)["derived"]
