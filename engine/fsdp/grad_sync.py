"""Deferred gradient sync: reduce gradients once per mini-batch instead of once per micro-batch.

``micro_batch_context(module, fsdp_version, index, count, ...)`` wraps the forward and backward of one micro-batch.
For every micro-batch but the last it turns gradient reduction off (FSDP1 ``no_sync()``, FSDP2
``set_requires_gradient_sync(False)``) and, when asked, keeps FSDP2 parameters unsharded after backward
(``set_reshard_after_backward(False)``). Each unit's previous settings are restored on exit, also when the
micro-batch raises, so a failure never leaves a model that silently stops reducing gradients. Only FSDP2's public
setters write settings; reading them back needs private state, which lives in ``private_state.py``.
"""

from __future__ import annotations

import contextlib

import torch.nn as nn

from . import private_state
from .sharding import UNWRAPPED


@contextlib.contextmanager
def _fsdp2_settings(module: nn.Module, units: list, sync: bool, reshard_after_backward: bool | None,
                    is_last: bool):
    # Unit by unit (``recurse=False``) over the given units: the recursive setters walk every submodule.
    saved = [(unit, private_state.requires_gradient_sync(unit), private_state.reshard_after_backward(unit))
             for unit in units]
    saved_last = private_state.is_last_backward(module)
    try:
        for unit in units:
            unit.set_requires_gradient_sync(sync, recurse=False)
            if reshard_after_backward is not None:
                unit.set_reshard_after_backward(reshard_after_backward, recurse=False)
        module.set_is_last_backward(is_last)
        yield
    finally:
        for unit, unit_sync, unit_reshard in saved:
            unit.set_requires_gradient_sync(unit_sync, recurse=False)
            unit.set_reshard_after_backward(unit_reshard, recurse=False)
        module.set_is_last_backward(saved_last)


def micro_batch_context(module: nn.Module, fsdp_version: int, index: int, count: int, *, deferred: bool,
                        keep_unsharded: bool, units: list | None = None):
    """The context one micro-batch's forward and backward run in (see the module docstring).

    ``units``: the FSDP2 units of ``module`` (``private_state.fsdp2_units``), when the caller keeps them; else
    found here.
    """
    if fsdp_version == UNWRAPPED:  # one rank: gradients accumulate in ``param.grad``, nothing to reduce
        return contextlib.nullcontext()
    is_last = index == count - 1
    if fsdp_version == 1:
        return module.no_sync() if deferred and not is_last else contextlib.nullcontext()  # no_sync restores itself
    units = private_state.fsdp2_units(module) if units is None else units
    if not deferred or is_last:
        if keep_unsharded:
            # The last backward reshards again, so parameters are sharded when the optimizer steps.
            return _fsdp2_settings(module, units, sync=True, reshard_after_backward=True, is_last=True)
        return _fsdp2_settings(module, units, sync=True, reshard_after_backward=None, is_last=is_last or not deferred)
    return _fsdp2_settings(module, units, sync=False, reshard_after_backward=False if keep_unsharded else None,
                           is_last=False)


def gradient_sync_enabled(module: nn.Module, fsdp_version: int) -> bool:
    """Whether the next backward would reduce gradients (tests and assertions read this)."""
    if fsdp_version == UNWRAPPED:
        return True  # unwrapped: every backward writes the final gradients
    if fsdp_version == 1:
        return private_state.fsdp1_requires_gradient_sync(module)
    return all(private_state.requires_gradient_sync(unit) for unit in private_state.fsdp2_units(module))


def discard_partial_backward(module: nn.Module, fsdp_version: int) -> None:
    """After a micro-batch failed: forget gradients FSDP accumulated without syncing, and reshard every unit.

    FSDP2 keeps skipped-sync gradients on its unsharded parameters, not on ``param.grad``; left there they would
    be added to the next mini-batch. FSDP1 keeps them in the flat gradient, which ``drop_gradients`` frees.
    """
    if fsdp_version == 2:  # unwrapped (0): the gradients are in ``param.grad``, which the caller clears
        private_state.reset_after_failure(module)
