"""Log-probabilities (and entropy) of the response tokens, without a full-vocabulary fp32 tensor per token.

A naive ``log_softmax(logits.float() / temperature)`` over ``[batch, prompt + response, vocab]`` holds the
logits, their fp32/temperature copy and the log-softmax at once: with Qwen's 151,936-token vocabulary, 8
sequences of 256 response tokens are 1.2 GB per copy. Here the model's output layer itself is replaced, for the
duration of the forward, by one that turns one slice of response positions at a time into logits and reduces
them to the chosen token's log-probability (and entropy, from the same logits): no ``[B, R, V]`` tensor exists at
all. With gradients and several slices, each slice is recomputed in the backward pass instead of being kept
(activation checkpointing of the slice).
Models whose logits are not a plain linear layer of the hidden states (soft-capping, scaling) get their logits at
the response positions only (``logits_to_keep``) and the same slice-by-slice reduction. The same code serves
packed micro-batches (``engine.packing``: several sequences in one row) and left-padded batches.
"""

from __future__ import annotations

import contextlib

import torch

from ..output_layer import in_chunks, replaced_forward, rows_per_chunk
from ..output_layer import plain_output_layer as _plain_output_layer
from ..rollout.engines.base import sampling_scores
from ..sequence_parallel import split_layout
from .groups import rank_values

SLICE_LOGITS = 256 * 151_936  # logits per log-softmax slice: 256 positions of Qwen's vocabulary, 156 MB in fp32


def rows_per_slice(vocab_size: int) -> int:
    """Positions per slice (``output_layer.rows_per_chunk``): 256 with Qwen's 151,936 tokens, 18,992 with 2,048;
    ``engine.output_layer.ROWS_PER_CHUNK`` overrides it."""
    return rows_per_chunk(vocab_size, SLICE_LOGITS)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` used them."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def _slice_outputs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
                   entropy_grad: bool = False, top_k: int = 0, top_p: float = 1.0):
    """Chosen-token log-probs of one slice of logits and, when asked, their entropy (no grad unless
    ``entropy_grad``: an entropy bonus in the loss), from one softmax.

    Under the sampling distribution (``sampling_scores``): with top-k / top-p the truncated tokens get the lowest
    float instead of ``-inf`` (zero probability, and no ``0 * inf`` in the entropy); the chosen token is never
    truncated.
    """
    scaled = sampling_scores(logits, temperature, top_k, top_p, keep=targets,
                             filter_value=torch.finfo(torch.float32).min)
    # Gather, then log-sum-exp: recomputed in the backward pass in this order, a checkpointed slice peaks one
    # slice-sized tensor lower (150 MB with Qwen's vocabulary; tests/scripts/logprob_memory.py --grad).
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    log_z = torch.logsumexp(scaled, dim=-1)
    chosen = picked - log_z
    if not with_entropy:
        return chosen, None
    if entropy_grad:
        return chosen, log_z - (torch.softmax(scaled, dim=-1) * scaled).sum(-1)
    with torch.no_grad():  # one temporary the size of the slice, reused in place
        detached, log_z = scaled.detach(), log_z.detach()
        weighted = (detached - log_z.unsqueeze(-1)).exp_().mul_(detached)
        entropy = log_z - weighted.sum(-1)
    return chosen, entropy


def _in_slices(compute, inputs: torch.Tensor, targets: torch.Tensor, with_entropy: bool, needs_grad: bool,
               vocab_size: int, entropy_grad: bool = False):
    """``compute(inputs_slice, targets_slice, with_entropy, entropy_grad)`` over ``rows_per_slice(vocab_size)``
    positions at a time (``output_layer.in_chunks``), shaped as ``targets``.

    With gradients and several slices each slice's log-probs are recomputed in the backward pass; the entropy of
    such a slice is a separate no-grad pass, so the recompute never repeats it, unless ``entropy_grad`` makes it part
    of the loss (then it is recomputed with the log-probs). A single slice's log-probs and entropy come from one
    softmax.
    """
    log_probs, entropy = in_chunks(lambda part, chosen, side: compute(part, chosen, side, side and entropy_grad),
                                   inputs, targets.reshape(-1), rows_per_slice(vocab_size), needs_grad,
                                   with_entropy, side_apart=not entropy_grad)
    return log_probs.view(targets.shape), (entropy.view(targets.shape) if with_entropy else None)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool = False,
                    entropy_grad: bool = False, top_k: int = 0, top_p: float = 1.0
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chosen-token log-probs (float32, shaped as ``targets``) of ``logits`` ``[..., V]``; optionally the entropy
    (no grad unless ``entropy_grad``), under the sampling's top-k / top-p truncation (0 / 1.0: none).

    Equal to ``log_softmax(logits.float() / temperature).gather(targets)`` without truncation, computed slice by
    slice over the positions of all rows together (not per row: fewer, larger kernels).
    """
    def compute(chunk, chosen, entropy, grad):
        return _slice_outputs(chunk, chosen, temperature, entropy, grad, top_k, top_p)

    return _in_slices(compute, logits.reshape(-1, logits.size(-1)), targets, with_entropy, logits.requires_grad,
                      logits.size(-1), entropy_grad)


@contextlib.contextmanager
def _fused_output_layer(head, select, targets: torch.Tensor, temperature: float, with_entropy: bool,
                        entropy_out: list, entropy_grad: bool = False, top_k: int = 0, top_p: float = 1.0):
    """Within the block the output layer returns the chosen tokens' log-probs (shaped as ``targets``) instead of
    logits.

    It runs inside the model's own forward (so a sharded model has its weights gathered, and its backward hooks
    see the result), on the hidden states of the kept positions, of which ``select`` picks the scored ones (one
    row each, in ``targets`` order), computing logits for one slice of them at a time (``_in_slices``).
    """
    def compute(hidden, chosen, entropy, grad):
        return _slice_outputs(torch.nn.functional.linear(hidden, head.weight, head.bias), chosen, temperature,
                              entropy, grad, top_k, top_p)

    def forward(hidden):
        needs_grad = hidden.requires_grad or head.weight.requires_grad
        log_probs, entropy = _in_slices(compute, select(hidden), targets, with_entropy, needs_grad,
                                        head.weight.size(0), entropy_grad)
        if with_entropy:
            entropy_out.append(entropy)
        # A new tensor, not a view: FSDP hooks the model's outputs for backward.
        return log_probs.clone()

    with replaced_forward(head, forward):
        yield


def _scored_log_probs(module, inputs: dict, logits_to_keep: torch.Tensor, select, targets: torch.Tensor,
                      temperature: float, with_entropy: bool, entropy_grad: bool, top_k: int, top_p: float):
    """One forward of ``module``: log-probs (and entropy) of ``targets``, predicted at the positions ``select``
    picks out of the kept ones; logits exist only for the kept positions, and only slice by slice when the output
    layer is a plain linear one."""
    kwargs = {**inputs, "logits_to_keep": logits_to_keep, "use_cache": False}
    head = _plain_output_layer(module)
    if head is not None:
        entropy_out: list = []
        with _fused_output_layer(head, select, targets, temperature, with_entropy, entropy_out, entropy_grad,
                                 top_k, top_p):
            log_probs = module(**kwargs).logits
        return log_probs, (entropy_out[0] if with_entropy else None)
    logits = select(module(**kwargs).logits)
    return token_log_probs(logits, targets, temperature, with_entropy, entropy_grad, top_k, top_p)


def sequence_log_probs(module, layout, temperature: float, with_entropy: bool = False, entropy_grad: bool = False,
                       top_k: int = 0, top_p: float = 1.0):
    """Log-probs ``[n, R]`` of each sequence's scored tokens under ``module`` (and their entropy when asked; with
    gradients when ``entropy_grad``), at the sampling temperature and with its top-k / top-p truncation.

    ``layout`` is an ``engine.packing.Layout`` on the module's device, packed or padded: either way the values come
    back per sequence, ``R`` the longest scored part, zeros past each sequence's end (``layout.scored_mask``).
    """
    log_probs, entropy = _scored_log_probs(module, layout.inputs, layout.logits_to_keep, layout.select,
                                           layout.targets, temperature, with_entropy, entropy_grad, top_k, top_p)
    log_probs = layout.to_rows(log_probs)
    return (log_probs, layout.to_rows(entropy)) if with_entropy else log_probs


def response_log_probs(module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                       temperature: float, with_entropy: bool = False, entropy_grad: bool = False, top_k: int = 0,
                       top_p: float = 1.0):
    """Log-probs ``[B, R]`` of the response tokens of a left-padded batch (and their entropy when asked; with
    gradients when ``entropy_grad``), at the sampling temperature and with its top-k / top-p truncation.

    Prompts are left-padded and responses right-padded, so the response occupies the last ``R`` positions and
    their logits come from the ``R`` positions before them: the model computes only those (``logits_to_keep``).
    """
    response_length = input_ids.size(1) - prompt_length
    targets = input_ids[:, prompt_length:]
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids(attention_mask)}
    keep = torch.arange(prompt_length - 1, prompt_length - 1 + response_length, device=input_ids.device)
    log_probs, entropy = _scored_log_probs(module, inputs, keep, lambda kept: kept.reshape(-1, kept.size(-1)),
                                           targets, temperature, with_entropy, entropy_grad, top_k, top_p)
    return (log_probs, entropy) if with_entropy else log_probs


def planned_log_probs(engine, data, temperature: float, what: str, top_k: int = 0, top_p: float = 1.0
                      ) -> torch.Tensor:
    """Forward-only log-probs of this rank's share of a step's sequences, on the host: ``[N, R]`` for the step's
    ``N`` sequences (rows of other ranks' shares stay 0); the pad tokens computed are counted as ``what``.

    ``data`` is the step's ``StepData``: its micro-batches are those of the update (same plan, same budget), so
    each rank computes exactly the rows it will train on and nothing moves between ranks afterwards. With sequence
    parallelism (``engine.sequence_parallel``) each rank of a group computes its slice's tokens and one sum over
    the group gives every rank the group's rows whole.
    """
    device, sp = engine.backend.device(), engine.sequence_parallel
    out = torch.zeros(len(data.sequences), data.width, device=device)  # filled on the device, read back once
    # Gathered as for generation (``generate_gather``: by default each sharded unit once for the whole pass, not
    # once per micro-batch, and no FSDP hook per forward): forward only, so nothing needs the shards back sooner.
    with torch.no_grad(), engine.generation_model() as module:
        for indices, micro in data.rank_layouts():
            data.count_pad_tokens(what, micro)
            piece = split_layout(micro, sp)
            values = sequence_log_probs(module, piece.to(device), temperature, top_k=top_k, top_p=top_p)
            values = rank_values(values, piece) if sp.enabled else values
            if indices:
                out[torch.tensor(indices, device=device), :values.size(1)] = values
    return (sp.group_sum(out, engine.backend.metrics_device()) if sp.enabled else out).cpu()
