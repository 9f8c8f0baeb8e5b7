"""The frozen reference's sequence log-probs of a step's pairs: its own engine (a frozen copy of the starting model,
offloadable with ``dpo.ref_param_offload``), or, with LoRA, the policy itself with its adapters disabled (the base
model: no second copy of the weights). One forward per micro-batch, chosen and rejected together, on the same
micro-batches the update then trains on."""

from __future__ import annotations

import contextlib

import torch

from ....sequence_parallel import slice_log_probs
from ...pair_batches import rank_share, sequence_sums


def sequence_log_probs(module, micro, sp, device) -> torch.Tensor:
    """Each sequence's log-prob ``[n]`` (the sum over its scored tokens) under ``module``, no gradient; with
    sequence parallelism the group's partial sums added, so every rank of it holds the whole sequences'."""
    layout, mask = rank_share(micro, sp, device)
    tokens, _ = slice_log_probs(module, layout)
    sums = sequence_sums(tokens * mask, layout, layout.sequences)
    return sp.group_sum(sums, sums.device) if sp.enabled else sums


@contextlib.contextmanager
def _base_model(engine):
    from peft import PeftModel

    peft_model = next(m for m in engine.module.modules() if isinstance(m, PeftModel))
    with peft_model.disable_adapter():
        yield


class Reference:
    """Where the reference log-probs come from: ``frozen`` (an engine) or, when None, ``policy`` without adapters."""

    def __init__(self, policy, frozen=None):
        self.policy, self.frozen = policy, frozen

    def fill(self, micro_batches, device) -> None:
        """Set each micro-batch's ``reference``: its sequences' log-probs under the reference model."""
        engine = self.frozen or self.policy
        sp = engine.sequence_parallel
        adapters_off = _base_model(engine) if self.frozen is None else contextlib.nullcontext()
        with engine.eval_mode(), adapters_off, torch.no_grad():
            for micro in micro_batches:
                micro.reference = sequence_log_probs(engine.module, micro, sp, device).cpu()
