"""PPO's critic: a value head on the policy's architecture (or ``critic.path``), its values at the step's response
positions, and its clipped value loss. A critic is a second trained engine (its own optimizer and schedule); the
frame checkpoints it with the policy (``engine/checkpoint/engine_set.py``).

The critic is ``AutoModelForTokenClassification`` with one label: the policy's transformer and a linear head
``hidden -> 1`` in place of the output layer (new, so every value starts where the head's init puts it). The value
of a response token is read where the policy's log-prob of that token is: at the position before it (the state in
which the token was chosen), so ``values``, ``log_probs`` and the response mask share one ``[N, R]`` layout.
"""

from __future__ import annotations

import torch
from torch import Tensor


def critic_factory(policy_source, critic_path: str | None = None, seed: int = 0):
    """A zero-argument builder of the critic: ``critic_path``'s model (a critic saved before, or any causal LM
    directory: its transformer, a new head), else the policy's own (a directory, or a factory of a causal LM)."""
    def build():
        critic = _build()
        head = getattr(critic, "score", None) or getattr(critic, "classifier", None)
        if head is not None:
            head.register_forward_hook(_values_of_their_own)
        return critic

    def _build():
        from transformers import AutoConfig, AutoModelForTokenClassification
        from transformers.utils import logging

        verbosity = logging.get_verbosity()
        logging.set_verbosity_error()  # "score.weight newly initialized" is the point, not a warning
        try:
            torch.manual_seed(seed)  # the new head: the same on every rank
            source = critic_path or (policy_source if isinstance(policy_source, str) else None)
            if source is not None:
                if torch.get_default_device().type == "meta":
                    return AutoModelForTokenClassification.from_config(
                        AutoConfig.from_pretrained(source, num_labels=1), dtype=torch.float32)
                return AutoModelForTokenClassification.from_pretrained(source, num_labels=1, dtype=torch.float32)
            policy = policy_source()  # a causal LM built in code (the CPU demo's): its transformer, copied
            config = policy.config
            config.num_labels = 1
            critic = AutoModelForTokenClassification.from_config(config, dtype=torch.float32)
            prefix = critic.base_model_prefix
            getattr(critic, prefix).load_state_dict(getattr(policy, prefix).state_dict())
            return critic
        finally:
            logging.set_verbosity(verbosity)

    return build


def _values_of_their_own(head, inputs, values: Tensor) -> Tensor:
    """The value head's output as a tensor of its own: a ``Linear`` with a bias on a 3-d input returns a view of its
    2-d result, and FSDP2 warned on every run ("returned a view tensor ... wrong gradients") about the critic's
    output. A copy of ``[rows, width, 1]`` values costs nothing next to the forward."""
    return values.clone() if values._base is not None else values


def token_values(module, layout) -> Tensor:
    """The critic's value ``[n, R]`` (fp32) of each scored token of ``layout`` (an ``engine.packing.Layout``,
    packed or padded), read at the position before it; zeros past each sequence's end."""
    outputs = module(**layout.inputs, use_cache=False).logits  # [rows, width, 1]
    kept = outputs[:, layout.logits_to_keep.to(outputs.device)]
    return layout.to_rows(layout.select(kept).squeeze(-1).float())


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *,
               clip_range: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's value loss: ``0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)`` averaged over the mask's
    tokens (``clip_range`` None: unclipped), and its figures (``vf_clip_frac``: the share of tokens where the
    clipped value was the larger loss), detached 0-dim tensors left on the device (the engine reads the step's
    sums once, not each micro-batch's)."""
    mask = mask.to(values.dtype)
    count = mask.sum().clamp(min=1.0)
    unclipped = (values - returns) ** 2
    if clip_range is None:
        losses, clipped_share = unclipped, values.new_zeros(())
    else:
        held = old_values + (values - old_values).clamp(-clip_range, clip_range)
        clipped = (held - returns) ** 2
        losses = torch.maximum(unclipped, clipped)
        clipped_share = ((clipped > unclipped).to(values.dtype) * mask).sum() / count
    loss = 0.5 * (losses * mask).sum() / count
    explained = ((returns - values).detach() * mask)
    metrics = {"vf_clip_frac": clipped_share.detach(), "values_mean": (values.detach() * mask).sum() / count,
               "vf_error": (explained ** 2).sum() / count}
    return loss, metrics


def own_micro_batches(plan_ranks, lengths: list[int], *, max_sequences: int | None, max_tokens: int | None,
                      padded: bool) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """A second trained engine's own micro-batches of one mini-batch, every rank's (``critic.micro_batch_size`` or
    ``critic.micro_batch_tokens``): each rank's sequences in the policy's plan (``plan_ranks``) planned again, so
    the rows whose values and returns a rank computed stay its own; every rank runs as many micro-batches (FSDP's
    collectives), the short ones with fillers (``()``). ``lengths``: every sequence's tokens."""
    from ....packing import plan_micro_batches

    def replanned(micro_batches) -> list[tuple[int, ...]]:
        mine = sorted(i for micro in micro_batches for i in micro)
        if not mine:
            return []
        plan = plan_micro_batches([lengths[i] for i in mine], 1, max_tokens=max_tokens,
                                  max_sequences=None if max_tokens else max_sequences, padded=padded)
        return [tuple(mine[j] for j in micro) for micro in plan.ranks[0] if micro]

    every = [replanned(micro_batches) for micro_batches in plan_ranks]
    count = max(1, max(len(micro_batches) for micro_batches in every))
    return tuple(tuple(micro_batches + [()] * (count - len(micro_batches))) for micro_batches in every)
