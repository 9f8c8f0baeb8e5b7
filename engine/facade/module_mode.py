"""The train/eval mode of an engine's module, set only when something may differ."""

from __future__ import annotations

import torch.nn as nn


class ModuleMode:
    """The open ``train_mode`` (True) / ``eval_mode`` (False) contexts of one engine, innermost last, and the
    mode last set on every submodule.

    The root's own flag reveals a ``module.train()``/``eval()`` made behind the engine's back (those recurse from
    the root), so the common case (already in the wanted mode) costs two attribute reads, whatever the depth of
    the model.
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._open: list[bool] = []
        self._set: bool | None = None  # the mode this object last set on every submodule

    def enter(self, training: bool) -> None:
        self._open.append(training)
        self._apply(training)

    def leave(self) -> None:
        """Close the innermost context: back to the enclosing one's mode (a no-op when it is the same)."""
        self._open.pop()
        if self._open:
            self._apply(self._open[-1])

    def _apply(self, training: bool) -> None:
        if self._set is training and self._module.training is training:
            return
        self._module.train(training)
        self._set = training
