"""Deferred gradient sync: reduce gradients once per mini-batch instead of once per micro-batch.

``micro_batch_context(module, index, count, ...)`` wraps the forward and backward of one micro-batch. For every
micro-batch but the last it turns gradient reduction off (FSDP1 ``no_sync()``, FSDP2
``set_requires_gradient_sync(False)``) and, when asked, keeps FSDP2 parameters unsharded after backward. The
previous settings are restored on exit, also when the micro-batch raises, so a failure never leaves a model that
silently stops reducing gradients.
"""

from __future__ import annotations

import contextlib

import torch.nn as nn


def _fsdp2_param_groups(module: nn.Module):
    """Every FSDP2 parameter group under ``module`` (torch 2.6 has one per module, newer torch a list)."""
    from torch.distributed.fsdp import FSDPModule

    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            state = sub._get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:
                group = getattr(state, "_fsdp_param_group", None)
                groups = [group] if group is not None else []
            yield from groups


@contextlib.contextmanager
def _fsdp2_settings(module: nn.Module, sync: bool, reshard_after_backward: bool | None, is_last: bool):
    groups = list(_fsdp2_param_groups(module))
    saved = [(g, g.reduce_grads, getattr(g, "all_reduce_grads", None), g.reshard_after_backward) for g in groups]
    state_ctx = module._get_fsdp_state()._state_ctx
    saved_last = state_ctx.is_last_backward
    try:
        for group in groups:
            group.reduce_grads = sync
            if hasattr(group, "all_reduce_grads"):
                group.all_reduce_grads = sync
            if reshard_after_backward is not None:
                group.reshard_after_backward = reshard_after_backward
        state_ctx.is_last_backward = is_last
        yield
    finally:
        for group, reduce_grads, all_reduce_grads, reshard in saved:
            group.reduce_grads = reduce_grads
            if all_reduce_grads is not None:
                group.all_reduce_grads = all_reduce_grads
            group.reshard_after_backward = reshard
        state_ctx.is_last_backward = saved_last


def micro_batch_context(module: nn.Module, fsdp_version: int, index: int, count: int, *, deferred: bool,
                        keep_unsharded: bool):
    """The context one micro-batch's forward and backward run in (see the module docstring)."""
    is_last = index == count - 1
    if not deferred or is_last:
        if fsdp_version == 2 and keep_unsharded:
            # The last backward reshards again, so parameters are sharded when the optimizer steps.
            return _fsdp2_settings(module, sync=True, reshard_after_backward=True, is_last=True)
        if fsdp_version == 2:
            return _fsdp2_settings(module, sync=True, reshard_after_backward=None, is_last=is_last or not deferred)
        return contextlib.nullcontext()
    if fsdp_version == 1:
        return module.no_sync()  # restores the previous setting itself, also on error
    return _fsdp2_settings(module, sync=False, reshard_after_backward=False if keep_unsharded else None,
                           is_last=False)


def gradient_sync_enabled(module: nn.Module, fsdp_version: int) -> bool:
    """Whether the next backward would reduce gradients (tests and assertions read this)."""
    if fsdp_version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return all(m._sync_gradients for m in module.modules() if isinstance(m, FullyShardedDataParallel))
    return all(g.reduce_grads for g in _fsdp2_param_groups(module))


def discard_partial_backward(module: nn.Module, fsdp_version: int) -> None:
    """After a micro-batch failed: forget gradients FSDP accumulated without syncing, and reshard.

    FSDP2 keeps skipped-sync gradients on its unsharded parameters, not on ``param.grad``; left there they would
    be added to the next mini-batch. FSDP1 keeps them in the flat gradient, which ``drop_gradients`` frees.
    """
    if fsdp_version != 2:
        return
    reset = getattr(module, "reset_iter_state", None)
    if reset is not None:  # torch >= 2.12 knows how to abandon an iteration
        try:
            reset()
        except AttributeError:
            pass  # FSDP2 initialises lazily: before the first forward there is nothing to reset
    else:  # older torch: reshard and reset the per-iteration marker by hand
        module.reshard()
        module._get_fsdp_state()._state_ctx.iter_forward_root = None
    for group in _fsdp2_param_groups(module):
        for fsdp_param in group.fsdp_params:
            fsdp_param.unsharded_accumulated_grad = None
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None:
                unsharded.grad = None
