"""Single-turn rollouts: prompts in, a ``RolloutBatch`` out, through the rollout engine chosen by ``rollout.engine``.

The engine (``engines/``: ``hf``, ``hf-continuous`` or a plugin's) samples; this module tokenizes the
prompts, checks what the engine returned against the interface's contract (a broken plugin is named here rather
than corrupting training), and lays the batch out as the trainer's log-prob forwards expect. The sampling
distribution is ``engines.base.sampling_scores`` for every engine, and the log-probs the trainer
computes use the same definition (temperature, top-k, top-p), so the rollout is on-policy whatever the engine.
Every EOS id the model lists ends a response.
"""

from __future__ import annotations

import dataclasses

import torch

from .engines import Responses, RolloutEngine, RolloutEngineError, SamplingConfig
from .engines.hf import left_padded, mask_through_first_eos
from .trajectories import Trajectories


@dataclasses.dataclass
class RolloutBatch:
    """Prompt (left-padded) + response (right-padded) sequences of one rank, on the host."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    response_mask: torch.Tensor  # [B, R]: the loss mask: the model's own response tokens, through the first EOS
    prompt_length: int
    responses: list[str]
    clipped: torch.Tensor  # [B] bool: the response reached max_new_tokens without an EOS
    sampling: SamplingConfig | None = None  # what the responses were sampled with
    tokens_computed: int = 0  # token positions the engine decoded (response_mask.sum() were kept)
    sampling_log_probs: torch.Tensor | None = None  # [B, R], when the sampling config asked the engine for them
    # Multi-turn rollouts (engine/rollout/multi_turn): tool and template tokens are in the response and attended to
    # (attention_mask) but 0 in response_mask, the loss mask; this holds each row's messages, environment, counts.
    trajectories: Trajectories | None = None  # None for a single-turn rollout

    def __len__(self) -> int:
        return self.input_ids.size(0)

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, R] the tokens the loss, KL and entropy count: ``response_mask`` (the attention mask covers more
        with tools: their results are attended to, not trained on)."""
        return self.response_mask

    @property
    def response_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_length:]


def _as_list(ids) -> list[int]:
    if ids is None:
        return []
    return [int(i) for i in ids] if isinstance(ids, (list, tuple)) else [int(ids)]


def eos_token_ids(module, tokenizer) -> list[int]:
    """Every id that ends a response: the model's generation config and config, and the tokenizer's EOS."""
    ids: list[int] = []
    for sub in module.modules():
        for holder in (getattr(sub, "generation_config", None), getattr(sub, "config", None)):
            if holder is not None and not isinstance(holder, dict):
                ids += _as_list(getattr(holder, "eos_token_id", None))
    ids += _as_list(tokenizer.eos_token_id)
    return sorted(set(ids))


def sampling_configs(rollout_config, eos_ids: list[int]) -> tuple[SamplingConfig, SamplingConfig]:
    """The training rollout's and validation's sampling settings, from the ``rollout`` section."""
    common = {"max_new_tokens": rollout_config.max_new_tokens, "eos_token_ids": tuple(eos_ids),
              "top_p": rollout_config.top_p, "top_k": rollout_config.top_k}
    return (SamplingConfig(n=rollout_config.n, temperature=rollout_config.temperature, **common),
            SamplingConfig(n=rollout_config.val_n, temperature=rollout_config.val_temperature, **common))


def rollout(engine: RolloutEngine, tokenizer, prompts: list[str], sampling: SamplingConfig) -> RolloutBatch:
    """Sample ``sampling.n`` responses per prompt with ``engine`` (consecutive rows form a group)."""
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    responses = _on_host(engine.generate(prompt_ids, sampling))
    check_responses(engine.name, responses, len(prompts), sampling)
    lengths = responses.mask.sum(dim=1)
    width = max(int(lengths.max()), 1)
    mask = responses.mask[:, :width].long()
    pad_id = tokenizer.pad_token_id
    response_ids = torch.where(mask.bool(), responses.token_ids[:, :width].long(), pad_id)
    prompt_tensor, prompt_mask = left_padded(prompt_ids, sampling.n, pad_id)
    last = response_ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    ends_at_eos = torch.isin(last, torch.tensor(sampling.eos_token_ids)) & (lengths > 0)
    log_probs = responses.log_probs
    return RolloutBatch(
        input_ids=torch.cat([prompt_tensor, response_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, mask], dim=1),
        response_mask=mask,
        prompt_length=prompt_tensor.size(1),
        responses=[tokenizer.decode(row[:length], skip_special_tokens=True)
                   for row, length in zip(response_ids, lengths, strict=True)],
        clipped=~ends_at_eos & (lengths >= sampling.max_new_tokens),
        sampling=sampling,
        tokens_computed=int(responses.tokens_computed),
        sampling_log_probs=None if log_probs is None else log_probs[:, :width].float() * mask,
    )


class SingleTurnRollout:
    """The sampler of a run without tools: each sample's prompt text, sampled ``sampling.n`` times. Called as the
    multi-turn ``MultiTurnRollout`` is, so a trainer holds one sampler and never asks which kind it has."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, engine: RolloutEngine, samples: list, sampling: SamplingConfig) -> RolloutBatch:
        return rollout(engine, self.tokenizer, [sample.prompt for sample in samples], sampling)


def _on_host(responses: Responses) -> Responses:
    """An engine may answer with tensors on its device; the batch lives on the host."""
    log_probs = responses.log_probs
    return dataclasses.replace(responses, token_ids=responses.token_ids.cpu(), mask=responses.mask.cpu(),
                               log_probs=None if log_probs is None else log_probs.cpu())


def check_responses(name: str, responses: Responses, prompts: int, sampling: SamplingConfig) -> None:
    """Refuse what breaks the interface's contract, naming the engine (``engines/base.py: Responses``)."""
    ids, mask, expected = responses.token_ids, responses.mask, prompts * sampling.n

    def fail(problem: str):
        raise RolloutEngineError(f"rollout engine {name!r} {problem}")

    if ids.dim() != 2 or ids.shape != mask.shape:
        fail(f"returned token_ids of shape {tuple(ids.shape)} and a mask of shape {tuple(mask.shape)}: both must "
             "be [responses, tokens]")
    if ids.size(0) != expected:
        fail(f"returned {ids.size(0)} responses for {prompts} prompts x rollout.n={sampling.n}: it must return "
             f"{expected}, the n responses of each prompt in consecutive rows")
    if bool(((mask != 0) & (mask != 1)).any()) or bool((mask[:, 1:] > mask[:, :-1]).any()):
        fail("returned a mask that is not 1 for each response's first tokens and 0 after them")
    longest = int(mask.sum(dim=1).max()) if ids.size(0) else 0
    if longest > sampling.max_new_tokens:
        fail(f"returned a response of {longest} tokens, longer than rollout.max_new_tokens="
             f"{sampling.max_new_tokens}")
    if ids.size(1) and not torch.equal(mask_through_first_eos(ids, sampling.eos_token_ids) * mask, mask.long()):
        fail(f"returned a response that goes on after an EOS id: each response must end at its first id of "
             f"{list(sampling.eos_token_ids)}")
    if responses.log_probs is not None and responses.log_probs.shape != mask.shape:
        fail(f"returned log_probs of shape {tuple(responses.log_probs.shape)} for a mask of {tuple(mask.shape)}")


def sync_weights(policy, engine: RolloutEngine) -> int:
    """Send the policy's weights to an engine that holds its own copy of the model (``receives_weights``); returns
    the bytes sent (what one engine copy receives).

    An engine serving the LoRA adapter on its own (``serves_adapter``) gets the base weights only while it needs them
    (once, at the start) and then the adapter alone, gathered without the base weights; any other gets the full
    weights, LoRA merged. Every tensor is drawn from the policy even if the engine stops early (each draw is a
    collective), and an engine that did not take them all is an error: its copy would be part old, part new.
    """
    if not engine.receives_weights:
        return 0
    if not engine.serves_adapter:
        return _on_wire(engine, _push(engine, engine.load_weights, policy.iter_full_weights(), "load_weights"))
    sent = 0
    if engine.needs_base_weights:
        sent += _on_wire(engine, _push(engine, engine.load_weights, policy.iter_full_weights(base_only=True),
                                       "load_weights"))
    return sent + _push(engine, engine.load_adapter, policy.iter_adapter_weights(), "load_adapter")


def _on_wire(engine: RolloutEngine, drawn: int) -> int:
    """The bytes a weight push put on the wire: the engine's own figure where it measures one (only changed
    elements with ``rollout.vllm.weight_sync=delta``), else every byte drawn."""
    stats = engine.push_stats
    return drawn if stats is None else stats.wire_bytes


def _push(engine: RolloutEngine, load, weights, verb: str) -> int:
    """``load(weights)``, counting what it took; the rest drawn (collectives) and refused."""
    taken, sent = 0, 0

    def counted():
        nonlocal taken, sent
        for name, tensor in weights:
            taken += 1
            sent += tensor.numel() * tensor.element_size()
            yield name, tensor

    load(counted())
    left = sum(1 for _ in weights)
    if left:
        raise RolloutEngineError(f"rollout engine {engine.name!r} took {taken} of {taken + left} weight tensors in "
                                 f"{verb}(): it must consume them all")
    return sent
