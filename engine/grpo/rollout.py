"""Rollouts: sampling responses with HF ``generate`` from exactly the distribution the log-probs assume.

A model directory's ``generation_config.json`` (repetition penalties, ``min_p``, ``top_k``, greedy decoding...)
would change what ``generate`` samples from while the trainer's log-probs assume plain temperature sampling: the
rollout would silently be off-policy. So the model's own generation config is set aside for the call and the
sampling settings come only from ``rollout.*``. Every EOS id the model lists ends a response.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from .logprobs import batched_log_probs  # noqa: F401 - moved to logprobs.py; importable from here one release


@dataclasses.dataclass
class RolloutBatch:
    """Prompt (left-padded) + response (right-padded) sequences of one rank, on the host."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    response_mask: torch.Tensor  # [B, R]: response tokens up to and including the first EOS
    prompt_length: int
    responses: list[str]
    clipped: torch.Tensor  # [B] bool: the response reached max_new_tokens without an EOS
    generate_output: object = None  # generate's full output when asked for (return_dict_in_generate=True)

    def __len__(self) -> int:
        return self.input_ids.size(0)

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


@contextlib.contextmanager
def model_generation_defaults_ignored(module):
    """Within the block, every HF model inside ``module`` has a blank ``GenerationConfig``."""
    from transformers import GenerationConfig

    saved = [(sub, sub.generation_config) for sub in module.modules()
             if isinstance(getattr(sub, "generation_config", None), GenerationConfig)]
    try:
        for sub, _ in saved:
            sub.generation_config = GenerationConfig()
        yield
    finally:
        for sub, original in saved:
            sub.generation_config = original


def sampling_options(temperature: float, top_p: float, top_k: int, greedy: bool = False) -> dict:
    """The only logits processors a rollout uses: temperature, then top-k and top-p truncation."""
    if greedy:
        return {"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0}
    return {"do_sample": True, "num_beams": 1, "temperature": temperature, "top_p": top_p, "top_k": top_k,
            "repetition_penalty": 1.0}


def rollout(engine, tokenizer, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
            top_p: float, top_k: int = 0, greedy: bool = False, **generate_kwargs) -> RolloutBatch:
    """Sample ``n`` responses per prompt (consecutive rows form a group)."""
    repeated = [p for p in prompts for _ in range(n)]
    encoded = tokenizer(repeated, return_tensors="pt", padding=True, add_special_tokens=False)
    device = engine.backend.device()
    eos_ids = eos_token_ids(engine.module, tokenizer)
    with model_generation_defaults_ignored(engine.module):
        output = engine.generate(
            input_ids=encoded["input_ids"].to(device),
            attention_mask=encoded["attention_mask"].to(device),
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos_ids,
            # Sharded forwards are collectives: a rank that finished early must keep stepping with the others.
            synced_gpus=engine.world_size > 1,
            **sampling_options(temperature, top_p, top_k, greedy),
            **generate_kwargs,
        )
    sequences = output.sequences if hasattr(output, "sequences") else output
    sequences = sequences.cpu()
    prompt_length = encoded["input_ids"].size(1)
    response = sequences[:, prompt_length:]
    is_eos = torch.isin(response, torch.tensor(eos_ids))
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0  # positions after the first EOS
    response_mask = (~after_eos).long()
    texts = [tokenizer.decode(row[mask.bool()], skip_special_tokens=True)
             for row, mask in zip(response, response_mask, strict=True)]
    return RolloutBatch(
        input_ids=sequences,
        attention_mask=torch.cat([encoded["attention_mask"], response_mask], dim=1),
        response_mask=response_mask,
        prompt_length=prompt_length,
        responses=texts,
        clipped=~is_eos.any(dim=1) & (response_mask.sum(dim=1) >= max_new_tokens),
        generate_output=output if hasattr(output, "sequences") else None,
    )
