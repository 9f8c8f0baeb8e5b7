"""The rollout-engine interface: what the trainer asks of whatever samples its responses.

An engine generates responses for a batch of prompts under a ``SamplingConfig`` and, when it keeps its own copy
of the model (vLLM, SGLang...), receives the policy's weights after every update. The trainer depends on this
interface only; ``hf`` and ``hf-continuous`` are implementations, and plugins add others (``registry.py``).

``sampling_scores`` is the definition every engine must sample from, and the one the trainer's log-probs use:
logits in float32, divided by the temperature, then top-k, then top-p truncation (Hugging Face's order and
semantics), renormalised by the softmax. Nothing else (no repetition penalty, no min-p, no model defaults).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to sample: ``n`` responses per prompt, each ending at the first id of ``eos_token_ids`` (included in
    the response) or after ``max_new_tokens``. ``temperature == 0`` is greedy decoding (top_k / top_p unused).

    ``log_probs``: also return each sampled token's log-probability under the sampling distribution (for
    checks; costs memory in some engines).
    """

    n: int
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    log_probs: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclasses.dataclass
class Responses:
    """What ``RolloutEngine.generate`` returns for ``P`` prompts: ``P * n`` rows, the ``n`` responses of prompt
    ``i`` at rows ``i * n .. i * n + n - 1``.

    ``token_ids`` ``[P * n, R]`` holds each response from its first token (right-padded with anything), ``mask``
    ``[P * n, R]`` is 1 for its tokens: up to and including the first EOS, at most ``max_new_tokens``.
    ``tokens_computed``: token positions the engine decoded for the call (rows in the batch at each decoding step),
    to set against the tokens produced (``mask.sum()``). ``log_probs`` ``[P * n, R]``: with
    ``SamplingConfig.log_probs``, each sampled token's log-probability under the sampling distribution.
    """

    token_ids: torch.Tensor
    mask: torch.Tensor
    tokens_computed: int
    log_probs: torch.Tensor | None = None


@dataclasses.dataclass
class RolloutContext:
    """What an engine is built from: the policy's engine (an ``engine.FSDPEngine``; its rank, world size and
    backend), the tokenizer, the model source (a local Hugging Face directory, or a zero-argument factory of the
    built-in model), the ``rollout`` section of the config, the longest prompt + response the run can see
    (``None`` when it is not known before the data is read) and the most response tokens this rank asks for in a
    step (``None``: not said; ``rollout.vllm.lora_sync=auto`` weighs it)."""

    policy: Any
    tokenizer: Any
    model: Any
    config: Any = None
    max_sequence_tokens: int | None = None
    decoded_tokens: int | None = None


class RolloutEngine:
    """Base class of rollout engines. Subclass it, implement ``generate`` (and ``load_weights`` when the engine
    holds its own copy of the model), and register the class (``hookspecs.register_rollout_engines``).

    ``receives_weights``: whether the trainer must send the policy's weights after each update (and once at the
    start). Engines that decode with the policy's own sharded parameters (``hf``, ``hf-continuous``) set it
    False. ``cheap_log_probs``: whether the trainer may ask every training rollout for the sampled tokens'
    log-probs (``SamplingConfig.log_probs``, for the mismatch metrics and ``algorithm.rollout_correction``); an
    engine for which that costs much (``hf`` keeps every decoding step's full scores for them) sets it False.
    ``name`` is set to the registered name when the registry builds the engine. ``serves_adapter``: the engine
    serves the base model with the policy's LoRA adapter on top (``load_adapter``): after an update only the
    adapter is sent, and the base weights (``load_weights``, plain names) only while ``needs_base_weights``.
    """

    name = "?"
    receives_weights = True
    cheap_log_probs = True
    multi_turn = True  # generate() continues any token-id prefix: tools and environments can use it
    serves_adapter = False
    needs_base_weights = True
    sleeps = False  # release_memory gives the engine's device memory back (vLLM's sleep mode where the device has one)
    push_stats = None  # the last load_weights' figures where the engine measures its wire (weight_delta.PushStats)

    def __init__(self, context: RolloutContext) -> None:
        self.context = context

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> Responses:
        """Sample ``sampling.n`` responses for each prompt (token ids, no padding). Every rank calls it with its
        own prompts, as many times as every other rank."""
        raise NotImplementedError(f"rollout engine {self.name!r} does not implement generate()")

    def release_memory(self) -> None:
        """Called before every update of the policy: an engine sharing the device with the trainer may free its
        memory here (vLLM's sleep mode); ``load_weights`` (or the next ``generate``) brings it back. Default:
        nothing."""

    def close(self) -> None:
        """Release what the engine holds (processes, servers, collectives). Called once when the rank's work ends,
        failed or not, while the process group still exists. Default: nothing."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take the policy's full weights, ``(name, tensor)`` one at a time (each valid only until the next one
        is drawn: copy it). Names are the model's own (``model.layers.0.mlp.up_proj.weight``; LoRA merged in).
        Every rank gets every tensor; consume the whole iterable (drawing the next tensor is a collective)."""
        raise NotImplementedError(f"rollout engine {self.name!r} receives weights but does not implement "
                                  "load_weights()")

    def load_adapter(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """With ``serves_adapter``: take the policy's LoRA adapter, ``(PEFT name, full tensor)`` for each of its
        tensors (``...q_proj.lora_A.default.weight``; each the rank's own copy), as its next version. Every rank
        gets every tensor; consume the whole iterable."""
        raise NotImplementedError(f"rollout engine {self.name!r} serves an adapter but does not implement "
                                  "load_adapter()")


def sampling_scores(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                    keep: torch.Tensor | None = None, filter_value: float = float("-inf")) -> torch.Tensor:
    """Log-scores of the sampling distribution over the last dimension (softmax them for probabilities).

    ``logits / temperature`` in float32; top-k keeps the ``top_k`` largest (ties at the boundary kept); top-p
    then keeps the smallest set of largest tokens whose probability reaches ``top_p`` (at least one). Removed
    tokens get ``filter_value``. ``keep`` (ids, one per row) are never removed: the trainer recomputes the logits
    of tokens already sampled, and a rounding difference at the top-p boundary must not give one zero probability.
    """
    scores = logits.float() if temperature == 1.0 else logits.float() / temperature  # no copy at 1.0 in fp32
    if top_k <= 0 and top_p >= 1.0:
        return scores
    with torch.no_grad():  # which tokens to remove: no gradient flows through the choice
        removed = torch.zeros_like(scores, dtype=torch.bool)
        if 0 < top_k < scores.size(-1):
            kth_largest = torch.topk(scores, top_k, dim=-1).values[..., -1:]
            removed = scores < kth_largest
        if top_p < 1.0:
            ascending, order = torch.sort(scores.masked_fill(removed, float("-inf")), dim=-1)
            below = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
            below[..., -1] = False  # the most likely token always stays
            removed = removed | below.scatter(-1, order, below)
        if keep is not None:
            removed.scatter_(-1, keep.unsqueeze(-1), False)
    return scores.masked_fill(removed, filter_value)
