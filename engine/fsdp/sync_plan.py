"""``grad_sync="auto"``: defer gradient sync only when the unsharded gradients it keeps fit the device.

Deferring sync to the last micro-batch saves one reduce-scatter per unit per micro-batch, but until then every
rank holds the *unsharded* gradient of every trainable parameter, whatever the world size (FSDP1 in the compute
dtype, FSDP2 in the fp32 reduce dtype). The plan compares what deferring adds against the free device memory the
backend reports, keeping a margin for activations, and falls back to syncing every micro-batch when it does not
fit. Formula and examples: ``docs/engine.md``.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn as nn

logger = logging.getLogger("engine")

ADAMW_STATES_PER_PARAM = 2  # exp_avg and exp_avg_sq, in the dtype of the sharded (fp32) parameter


@dataclasses.dataclass(frozen=True)
class GradSyncPlan:
    """The gradient-sync decision of one engine: the mode in use and why.

    needed_bytes: what deferred sync adds on this rank (unsharded gradients minus the sharded ones they replace).
    reserved_bytes: device memory still to come that deferring must leave room for (optimizer state that will be
        on the device during forward/backward but does not exist yet).
    free_bytes: the backend's free device memory when the plan was made (``None``: the backend cannot tell).
    """

    mode: str
    requested: str
    needed_bytes: int
    reserved_bytes: int
    free_bytes: int | None
    margin: float
    reason: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def trainable_numel(model: nn.Module) -> int:
    """Elements of all trainable parameters, counted on the unsharded model (tied weights once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def deferred_extra_bytes(numel: int, fsdp_version: int, compute_dtype: torch.dtype, world_size: int) -> int:
    """Bytes deferred sync adds on one rank: unsharded gradients of ``numel`` trainable elements, less their shards.

    FSDP1 (``no_sync``) accumulates in the unsharded flat parameter's gradient, in the compute dtype. FSDP2
    accumulates unsharded gradients upcast to the reduce dtype (fp32) when parameters are cast, else in the
    parameter dtype (fp32). Only trainable parameters have gradients (LoRA: the adapters).
    """
    element = compute_dtype.itemsize if fsdp_version == 1 else max(compute_dtype.itemsize, 4)
    sharded = numel * 4 // max(world_size, 1)  # the fp32 sharded gradient that exists either way
    return max(numel * element - sharded, 0)


def optimizer_state_bytes(numel: int, world_size: int) -> int:
    """AdamW state this rank will hold once the first step created it (two fp32 tensors per trainable shard)."""
    return ADAMW_STATES_PER_PARAM * 4 * numel // max(world_size, 1)


def plan(requested: str, *, needed_bytes: int, reserved_bytes: int, free_bytes: int | None,
         margin: float) -> GradSyncPlan:
    """Decide the mode. Explicit choices are kept (and their memory reported); ``"auto"`` checks the fit."""
    common = dict(requested=requested, needed_bytes=needed_bytes, reserved_bytes=reserved_bytes,
                  free_bytes=free_bytes, margin=margin)
    if requested != "auto":
        return GradSyncPlan(mode=requested, reason="set explicitly in EngineConfig.grad_sync", **common)
    if needed_bytes == 0:
        return GradSyncPlan(mode="deferred", reason="deferring adds no memory here (one rank, or nothing to "
                            "train)", **common)
    if free_bytes is None:
        return GradSyncPlan(mode="every_micro_batch", reason="the backend reports no free memory figure, so "
                            "the unsharded gradients of deferred sync might not fit; set grad_sync='deferred' "
                            "to defer anyway", **common)
    budget = free_bytes * (1.0 - margin) - reserved_bytes
    if needed_bytes <= budget:
        return GradSyncPlan(mode="deferred", reason=f"the unsharded gradients ({_gib(needed_bytes)}) fit the free "
                            f"memory ({_gib(free_bytes)}, less a {margin:.0%} margin and "
                            f"{_gib(reserved_bytes)} of optimizer state to come)", **common)
    return GradSyncPlan(mode="every_micro_batch", reason=f"the unsharded gradients ({_gib(needed_bytes)}) do not "
                        f"fit the free memory ({_gib(free_bytes)}, less a {margin:.0%} margin and "
                        f"{_gib(reserved_bytes)} of optimizer state to come)", **common)


def log_plan(decision: GradSyncPlan, rank: int) -> None:
    """Say once (rank 0) which mode is in use and why; a fallback from ``"auto"`` is a warning."""
    if rank != 0:
        return
    message = f"gradient sync: {decision.mode} ({decision.reason})"
    if decision.requested == "auto" and decision.mode != "deferred":
        logger.warning(message)
    else:
        logger.info(message)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"
