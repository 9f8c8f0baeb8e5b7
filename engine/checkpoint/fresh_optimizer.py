"""Saving must not change training: torch's ``get_state_dict`` gives an optimizer that has never stepped its state
by running one step with zero gradients and learning rate 0. The weights are untouched, but each parameter's step
count is then 1, so the first real update after a save would use the second step's bias correction (Adam's): PPO's
policy, saved while it waits out the critic's warm-up, trained differently with ``run.save_every=1`` than without.
Setting those counts back to 0 makes the state (the kept one and the saved one) exactly what a fresh optimizer's
first step builds: moments of zero and no step taken, so a run trains the same whether or not it saved, or resumed
from such a save."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def never_stepped(optimizer) -> bool:
    """Whether ``optimizer`` has no state yet (no step taken): a checkpoint read would create one."""
    return not optimizer.state


def unstep(*states: Iterable[dict]) -> None:
    """Set every ``step`` count in ``states`` (per-parameter state dicts: the optimizer's own, and the copy a
    checkpoint writes) back to 0, in place."""
    for group in states:
        for state in group:
            step = state.get("step")
            if isinstance(step, torch.Tensor):
                step.zero_()
            elif step is not None:
                state["step"] = type(step)(0)
