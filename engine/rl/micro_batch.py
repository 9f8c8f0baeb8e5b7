"""One rank's micro-batch of a policy update, as the loss takes it (``update.policy_loss_of``, through
``FSDPEngine.forward_backward_batch``): its rows of every stream the terms read, the mini-batch's sizes, and its own
rollout/trainer mismatch statistics, which its loss fills (the first PPO epoch's only) and the update adds up
afterwards (``MismatchStats.total``): nothing is accumulated through a shared object riding inside it."""

from __future__ import annotations

import dataclasses

from torch import Tensor

from .rollout_correction import MismatchStats
from .terms import MiniBatchSize


@dataclasses.dataclass
class PolicyMicroBatch:
    layout: object  # engine.packing.Layout: the model's inputs (a filler's: no rows)
    loss_mask: Tensor  # [n, R] this micro-batch's loss tokens (host)
    advantages: Tensor  # [n] per sequence or [n, R] per token
    old_log_probs: Tensor | None  # None: the policy's own, detached, are the old ones
    frozen: dict[str, Tensor]  # the frozen models' log-probs by name
    sampling_log_probs: Tensor | None  # the rollout engine's, when it returned them
    micro_batches: int  # non-empty micro-batches of the mini-batch (each weighs the same for bnpo)
    mini_batch: MiniBatchSize | None = None  # the mini-batch's sizes (normalisers over the whole of it)
    mismatch: MismatchStats | None = None  # its own mismatch statistics, filled by its loss; None: not recorded
