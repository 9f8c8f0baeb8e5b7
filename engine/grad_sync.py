"""Deferred gradient sync: reduce gradients once per mini-batch instead of once per micro-batch.

``micro_batch_context(module, fsdp_version, index, count, ...)`` wraps the forward and backward of one micro-batch.
For every micro-batch but the last it turns gradient reduction off (FSDP1 ``no_sync()``, FSDP2
``set_requires_gradient_sync(False)``) and, when asked, keeps FSDP2 parameters unsharded after backward
(``set_reshard_after_backward(False)``). Each unit's previous settings are restored on exit, also when the
micro-batch raises, so a failure never leaves a model that silently stops reducing gradients. Only FSDP2's public
setters write settings; reading them back needs private state, which lives in ``compat.py``.
"""

from __future__ import annotations

import contextlib

import torch.nn as nn

from . import compat
from .sharding import UNWRAPPED


@contextlib.contextmanager
def _fsdp2_settings(module: nn.Module, sync: bool, reshard_after_backward: bool | None, is_last: bool):
    units = compat.fsdp2_units(module)
    saved = [(unit, compat.requires_gradient_sync(unit), compat.reshard_after_backward(unit)) for unit in units]
    saved_last = compat.is_last_backward(module)
    try:
        module.set_requires_gradient_sync(sync)  # recurses into every unit
        if reshard_after_backward is not None:
            module.set_reshard_after_backward(reshard_after_backward)
        module.set_is_last_backward(is_last)
        yield
    finally:
        for unit, unit_sync, unit_reshard in saved:
            unit.set_requires_gradient_sync(unit_sync, recurse=False)
            unit.set_reshard_after_backward(unit_reshard, recurse=False)
        module.set_is_last_backward(saved_last)


def micro_batch_context(module: nn.Module, fsdp_version: int, index: int, count: int, *, deferred: bool,
                        keep_unsharded: bool):
    """The context one micro-batch's forward and backward run in (see the module docstring)."""
    if fsdp_version == UNWRAPPED:  # one rank (one rank): gradients accumulate in ``param.grad``, nothing to reduce
        return contextlib.nullcontext()
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
    if fsdp_version == UNWRAPPED:
        return True  # unwrapped: every backward writes the final gradients
    if fsdp_version == 1:
        return compat.fsdp1_requires_gradient_sync(module)
    return all(compat.requires_gradient_sync(unit) for unit in compat.fsdp2_units(module))


def discard_partial_backward(module: nn.Module, fsdp_version: int) -> None:
    """After a micro-batch failed: forget gradients FSDP accumulated without syncing, and reshard every unit.

    FSDP2 keeps skipped-sync gradients on its unsharded parameters, not on ``param.grad``; left there they would
    be added to the next mini-batch. FSDP1 keeps them in the flat gradient, which ``drop_gradients`` frees.
    """
    if fsdp_version == 2:  # unwrapped (0): the gradients are in ``param.grad``, which the caller clears
        compat.reset_after_failure(module)
