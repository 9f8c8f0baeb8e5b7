"""``hf-continuous``: a decode loop on the policy's own sharded model in which finished rows leave the batch.

Hugging Face ``generate`` keeps every row decoding until the longest response ends; with responses of 1 to 128
tokens about a third of that work is spent on rows that already finished. Here finished rows leave the batch:
their entries in the KV cache are dropped and the next forwards run on the rows still decoding, so the token
positions computed are within ``LEAVE_AT`` of the tokens produced. The KV cache is written in place rather than
concatenated at every step, and tokens are drawn by inverse transform rather than ``torch.multinomial``. Sampling
is ``base.sampling_scores`` and nothing else (the model's generation config is never read).

transformers' own continuous batching (``generate_batch``) runs on the CPU too, but took 6 times the CPU time of
``generate`` for the same work here (docs/perf.md): its paged cache and scheduler are built for accelerators.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ...runtime import on_any_rank
from .base import Responses, SamplingConfig, sampling_scores
from .hf import PolicyDecoding

LEAVE_AT = 0.125  # finished rows leave the batch once they are this share of it (see decode)


class ContinuousRolloutEngine(PolicyDecoding):
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> Responses:
        policy, pad_id, input_ids, attention_mask, device = self.left_padded_batch(prompts, sampling)
        anyone_busy = None
        if policy.generation_is_collective:  # every forward gathers layers: step with the other ranks
            anyone_busy = _anyone_busy(policy.backend.metrics_device())
        with policy.eval_mode(), policy.generation_model() as model:
            return decode(model, input_ids.to(device), attention_mask.to(device), sampling, pad_id, anyone_busy)


def _anyone_busy(device: torch.device) -> Callable[[bool], bool]:
    return lambda busy: on_any_rank(busy, device)


def sample(logits: torch.Tensor, sampling: SamplingConfig, with_log_probs: bool):
    """The next token of each row and, when asked, its log-probability under the sampling distribution.

    By inverse transform: one uniform number per row, located in the cumulative probabilities. It draws from the
    same distribution as ``torch.multinomial`` (which ``generate`` uses) at a fraction of the cost on the CPU, where
    ``multinomial`` draws a random number per vocabulary entry (14 ms against 2.7 ms for 128 x 2048 here).
    """
    if sampling.greedy:
        return logits.argmax(dim=-1), None
    scores = sampling_scores(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    cumulative = scores.softmax(dim=-1).cumsum(dim=-1)
    # 1 - u lies in (0, 1]: the point is never 0, so a token of probability 0 (top-k, top-p) is never chosen.
    point = (1 - torch.rand(cumulative.size(0), 1, device=cumulative.device)) * cumulative[:, -1:]
    chosen = torch.searchsorted(cumulative, point).squeeze(1).clamp_(max=cumulative.size(-1) - 1)
    if not with_log_probs:
        return chosen, None
    return chosen, torch.log_softmax(scores, dim=-1).gather(-1, chosen.unsqueeze(1)).squeeze(1)


def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingConfig, pad_id: int,
           anyone_busy: Callable[[bool], bool] | None = None) -> Responses:
    """Sample a response for each row of the left-padded ``input_ids``; rows leave the batch when they end.

    Finished rows leave once they are at least ``LEAVE_AT`` of the batch: dropping them copies the rest of the
    KV cache, so it is done in batches rather than at every EOS (the rows waiting to leave are the difference
    between tokens computed and produced). ``anyone_busy(busy)``: given, every rank makes the same number of
    forwards (they are collectives): the loop runs while any rank has rows left, and a rank without rows makes a
    one-token forward to keep in step.
    """
    rows, limit, device = input_ids.size(0), sampling.max_new_tokens, input_ids.device
    tokens = torch.full((rows, limit), pad_id, dtype=torch.long, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    with_log_probs = sampling.log_probs and not sampling.greedy
    log_probs = torch.zeros(rows, limit, device=device) if with_log_probs else None
    eos = torch.tensor(list(sampling.eos_token_ids), device=device)
    batch_rows = torch.arange(rows, device=device)  # the original row of each row in the batch
    finished = torch.zeros(rows, dtype=torch.bool, device=device)  # per batch row
    cache = _kv_cache(model, capacity=input_ids.size(1) + limit)
    cache_keyword = _cache_keyword(model)
    position = attention_mask.sum(dim=1) - 1  # of each row's last token
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
              "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0)}
    computed = step = 0
    while True:
        busy = batch_rows.numel() > 0 and step < limit
        if anyone_busy is not None:
            if not anyone_busy(busy):
                break
            if not busy:  # keep the other ranks' collectives company
                model(input_ids=torch.full((1, 1), pad_id, device=device), use_cache=False, logits_to_keep=1)
                computed += 1
                continue
        elif not busy:
            break
        logits = model(**inputs, **{cache_keyword: cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
        chosen, chosen_log_probs = sample(logits, sampling, with_log_probs)
        computed += batch_rows.numel()
        writing = batch_rows[~finished]
        tokens[writing, step] = chosen[~finished]
        if log_probs is not None:
            log_probs[writing, step] = chosen_log_probs[~finished]
        lengths[writing] = step + 1
        finished = finished | torch.isin(chosen, eos)
        done = int(finished.sum())
        if done and done >= LEAVE_AT * batch_rows.numel():  # the finished rows leave the batch and the cache
            stay = torch.nonzero(~finished).squeeze(1)
            if stay.numel():
                cache.batch_select_indices(stay)
            batch_rows, chosen, attention_mask, position = (batch_rows[stay], chosen[stay], attention_mask[stay],
                                                            position[stay])
            finished = finished[stay]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch_rows.numel(), 1)], dim=1)
        position = position + 1
        inputs = {"input_ids": chosen.unsqueeze(1), "attention_mask": attention_mask,
                  "position_ids": position.unsqueeze(1)}
        step += 1
    mask = (torch.arange(limit, device=device) < lengths.unsqueeze(1)).long()
    return Responses(token_ids=tokens.cpu(), mask=mask.cpu(), tokens_computed=computed,
                     log_probs=None if log_probs is None else log_probs.cpu())


def _cache_keyword(model) -> str:
    """The forward's name for the KV cache: ``cache`` from transformers 5.24 on, ``past_key_values`` before."""
    from transformers import PreTrainedModel

    hf_model = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), model)
    return "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"


def _kv_cache(model, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers write into room reserved for the whole call.

    ``DynamicCache`` concatenates each step's keys and values to the cache, copying all of it at every step:
    quadratic in the response length, and on the CPU the largest single cost of a long decode here. Layers of
    other kinds (sliding window...) keep transformers' own implementation.
    """
    cache = DynamicCache(config=getattr(model, "config", None))
    cache.layers = [ReservedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes new keys and values in place into a buffer of ``capacity`` positions."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.filled = capacity, 0
        self._keys = self._values = None

    def update(self, key_states, value_states, *args, **kwargs):
        if self._keys is None:
            self.lazy_initialization(key_states, value_states)
            self._keys = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[-1]))
            self._values = value_states.new_empty((*value_states.shape[:2], self.capacity, value_states.shape[-1]))
        end = self.filled + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"the reserved KV cache holds {self.capacity} positions; {end} were needed")
        self._keys[:, :, self.filled:end] = key_states
        self._values[:, :, self.filled:end] = value_states
        self.filled = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._keys is not None:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self.keys, self.values = self._keys[:, :, :self.filled], self._values[:, :, :self.filled]
