"""Device guards (issue 46): host tensors never reach a device's collectives (the strict stand-in's rule, and the
REINFORCE++ helpers that broke it), and HCCL's connect timeout within CANN's range."""

import pytest
import torch
import torch.distributed as dist

import accel_backends
from accel_backends.backends.npu import HCCL_CONNECT_TIMEOUT_RANGE_S, NPUBackend, hccl_connect_timeout
from accel_backends.testing import strict_group
from accel_backends.testing.strict import StrictBackend
from accel_backends.testing.strict_group import HostTensorInCollective


class StrictOnADevice(StrictBackend):
    """The strict stand-in whose collectives take tensors of another device ('meta': torch's device without data,
    so the rule is exercised here without an accelerator)."""

    name = "strict-on-a-device"

    def metrics_device(self) -> torch.device:
        return torch.device("meta")


class Reached(Exception):
    """The collective itself was reached, past the strict rules."""


@pytest.fixture
def two_rank_fake_group():
    """torch's fake process group (two ranks in this process; collectives do nothing) with the strict rules of
    ``StrictOnADevice``; ``seen`` records the devices of what reached the collectives."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    seen = []

    def all_reduce(tensor, *args, **kwargs):
        seen.append(tensor.device)
        raise Reached

    original = dist.all_reduce
    dist.all_reduce = all_reduce  # what the rules wrap: the collective under them
    backend = StrictOnADevice()
    strict_group.install(backend.name, backend.collective_reduce_dtypes, backend.metrics_device().type)
    try:
        yield backend, seen
    finally:
        strict_group.uninstall()
        dist.all_reduce = original
        dist.destroy_process_group()


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
