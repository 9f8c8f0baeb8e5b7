"""The choices ``FSDPEngine`` makes once, while it is built: sequence-parallel group, attention, gradient sync."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

import accel_backends

from .. import packing, sequence_parallel
from ..config import EngineConfig
from ..fsdp import sync_plan
from ..fsdp.sharding import compute_dtype


def sequence_parallel_group(config: EngineConfig, world_size: int, model_config: Any, model: nn.Module,
                            backend: accel_backends.DeviceBackend) -> sequence_parallel.SequenceParallel:
    """This rank's sequence-parallel group (``engine.sequence_parallel``), once the settings, the model and the
    device are known to allow the split: else one line naming each problem."""
    size = config.sequence_parallel_size
    problems = [*sequence_parallel.config_problems(size, world_size, fsdp_version=config.fsdp_version,
                                                   attn_implementation=config.attn_implementation),
                *sequence_parallel.model_problems(size, model_config, backend.sequence_parallel_facts()),
                *sequence_parallel.module_problems(size, model)]
    if problems:
        raise ValueError("invalid EngineConfig: " + "; ".join(problems))
    return sequence_parallel.SequenceParallel.create(backend, size)


def attention_choice(config: EngineConfig, backend: accel_backends.DeviceBackend,
                     sequences_split: bool) -> str:
    """The configured attention implementation, else the backend's (flash kernels need half precision), with
    ``sdpa`` run as ``packed_sdpa`` (the same, but a packed row costs what its sequences cost); ``ulysses``
    (sdpa with the exchange) when sequences are split."""
    if sequences_split:
        return sequence_parallel.register_ulysses()
    chosen = config.attn_implementation
    if chosen is None:
        chosen = backend.attention_implementation(packed=True)
        if chosen.startswith("flash_attention") and compute_dtype(config, backend) == torch.float32:
            chosen = "sdpa"
        if chosen == "sdpa":
            chosen = packing.PACKED_SDPA
    if chosen == packing.PACKED_SDPA:
        packing.register_packed_sdpa()
    return chosen


def plan_grad_sync(config: EngineConfig, backend: accel_backends.DeviceBackend, fsdp_version: int,
                   world_size: int, rank: int, trainable_numel: int) -> sync_plan.GradSyncPlan:
    """Decide deferred or per-micro-batch gradient sync from this rank's memory (see ``fsdp/sync_plan.py``)."""
    needed = sync_plan.deferred_extra_bytes(trainable_numel, fsdp_version, compute_dtype(config, backend),
                                            world_size)
    optimizer_on_device_in_backward = not (config.optimizer_offload and config.optimizer_onload == "step")
    reserved = (sync_plan.optimizer_state_bytes(trainable_numel, world_size)
                if optimizer_on_device_in_backward and not config.frozen else 0)
    decision = sync_plan.plan(config.grad_sync, needed_bytes=needed, reserved_bytes=reserved,
                              free_bytes=backend.memory_stats().free, margin=config.grad_sync_margin)
    sync_plan.log_plan(decision, rank)
    return decision
