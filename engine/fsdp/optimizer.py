"""AdamW, the learning-rate schedule, and a gradient norm that is right for sharded gradients."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from ..config import EngineConfig


def build_optimizer(module: nn.Module, config: EngineConfig) -> torch.optim.Optimizer:
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (all have requires_grad=False)")
    return torch.optim.AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps,
                             weight_decay=config.weight_decay)


class LRFactor:
    """Multiplier of the base learning rate at a step: linear warm-up, then constant, linear or cosine decay.

    A class rather than a closure so the scheduler's state dict holds plain numbers (safe to load).
    """

    def __init__(self, schedule: str, warmup_steps: int, total_steps: int | None, min_ratio: float) -> None:
        self.schedule, self.warmup_steps = schedule, warmup_steps
        self.total_steps, self.min_ratio = total_steps, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.schedule == "linear":
            decay = 1.0 - progress
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_ratio + (1.0 - self.min_ratio) * decay


def build_scheduler(optimizer: torch.optim.Optimizer, config: EngineConfig):
    factor = LRFactor(config.lr_schedule, config.warmup_steps, config.total_steps, config.min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def clip_gradients(module: nn.Module, fsdp_version: int, max_norm: float | None) -> torch.Tensor:
    """Clip to ``max_norm`` (``None``: only measure) and return the global norm over all ranks' shards."""
    limit = math.inf if max_norm is None else max_norm
    if fsdp_version == 1:
        return module.clip_grad_norm_(limit)
    params = [p for p in module.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, limit, error_if_nonfinite=False, foreach=True)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
