"""engine/fsdp/sync_plan.py: what deferred gradient sync costs in memory, and the "auto" decision."""

import logging

import pytest
import torch

from engine.fsdp import sync_plan

GIB = 2**30


def test_deferred_extra_bytes_by_fsdp_version_and_dtype():
    numel = 1000
    # FSDP2 keeps unsharded gradients in fp32 even when computing in bf16; FSDP1 in the compute dtype.
    assert sync_plan.deferred_extra_bytes(numel, 2, torch.bfloat16, world_size=2) == 4000 - 2000
    assert sync_plan.deferred_extra_bytes(numel, 1, torch.bfloat16, world_size=2) == 2000 - 2000
    assert sync_plan.deferred_extra_bytes(numel, 1, torch.float32, world_size=4) == 4000 - 1000
    assert sync_plan.deferred_extra_bytes(numel, 2, torch.float32, world_size=1) == 0  # one rank: nothing extra


def test_optimizer_state_is_two_fp32_tensors_per_trainable_shard():
    assert sync_plan.optimizer_state_bytes(1000, world_size=4) == 2 * 4 * 250


def test_explicit_choices_are_kept_whatever_the_memory():
    plan = sync_plan.plan("every_micro_batch", needed_bytes=1, reserved_bytes=0, free_bytes=100 * GIB, margin=0.2)
    assert plan.mode == "every_micro_batch" and "explicitly" in plan.reason
    plan = sync_plan.plan("deferred", needed_bytes=100 * GIB, reserved_bytes=0, free_bytes=1, margin=0.2)
    assert plan.mode == "deferred"


@pytest.mark.parametrize(("needed", "reserved", "free", "mode"), [
    (0, 0, None, "deferred"),  # nothing extra to hold
    (1, 0, None, "every_micro_batch"),  # the backend cannot tell: the safe choice
    (8 * GIB, 0, 10 * GIB, "deferred"),  # 8 fits 10 less 20%
    (8 * GIB + 1, 0, 10 * GIB, "every_micro_batch"),  # one byte over the budget
    (6 * GIB, 2 * GIB + 1, 10 * GIB, "every_micro_batch"),  # optimizer state still to come counts
])
def test_auto_defers_exactly_when_the_unsharded_gradients_fit(needed, reserved, free, mode):
    plan = sync_plan.plan("auto", needed_bytes=needed, reserved_bytes=reserved, free_bytes=free, margin=0.2)
    assert plan.mode == mode, plan.reason
    assert plan.as_dict()["requested"] == "auto"


def test_a_fallback_from_auto_is_a_warning_on_rank_0_only(caplog):
    fallback = sync_plan.plan("auto", needed_bytes=2, reserved_bytes=0, free_bytes=1, margin=0.0)
    with caplog.at_level(logging.INFO, logger="engine"):
        sync_plan.log_plan(fallback, rank=1)
        assert not caplog.records
        sync_plan.log_plan(fallback, rank=0)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "every_micro_batch" in record.getMessage()
