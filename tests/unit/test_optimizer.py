"""engine/fsdp/optimizer.py: the learning-rate schedule, step by step."""

import math

import pytest
import torch

from engine import EngineConfig
from engine.fsdp.optimizer import LRFactor, build_scheduler


def test_warmup_is_linear_then_constant():
    factor = LRFactor("constant", warmup_steps=4, total_steps=None, min_ratio=0.0)
    assert [factor(step) for step in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_decay_reaches_the_floor_at_total_steps_and_stays():
    factor = LRFactor("linear", warmup_steps=0, total_steps=10, min_ratio=0.1)
    assert factor(0) == 1.0
    assert factor(5) == pytest.approx(0.1 + 0.9 * 0.5)
    assert factor(10) == pytest.approx(0.1) and factor(50) == pytest.approx(0.1)


def test_cosine_decay_after_warmup():
    factor = LRFactor("cosine", warmup_steps=2, total_steps=12, min_ratio=0.0)
    assert factor(1) == 1.0  # the last warm-up step
    assert factor(2) == pytest.approx(1.0)
    assert factor(7) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factor(12) == pytest.approx(0.0, abs=1e-12)


def test_the_schedule_drives_the_optimizer_and_its_state_is_plain_numbers():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=1.0)
    scheduler = build_scheduler(optimizer, EngineConfig(lr=1.0, lr_schedule="linear", total_steps=4))
    seen = []
    for _ in range(5):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    state = scheduler.state_dict()["lr_lambdas"][0]
    assert state == {"schedule": "linear", "warmup_steps": 0, "total_steps": 4, "min_ratio": 0.0}
