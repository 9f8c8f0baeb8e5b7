"""Rollouts (sampling responses with HF ``generate``) and per-token log-probabilities of those responses."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class RolloutBatch:
    """Prompt (left-padded) + response (right-padded) sequences of one rank, on the host."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    response_mask: torch.Tensor  # [B, R]: response tokens up to and including the first EOS
    prompt_length: int
    responses: list[str]

    def __len__(self) -> int:
        return self.input_ids.size(0)

    @property
    def response_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_length:]


def rollout(engine, tokenizer, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
            top_p: float) -> RolloutBatch:
    """Sample ``n`` responses per prompt (consecutive rows form a group)."""
    repeated = [p for p in prompts for _ in range(n)]
    encoded = tokenizer(repeated, return_tensors="pt", padding=True, add_special_tokens=False)
    device = engine.backend.device()
    output = engine.generate(
        input_ids=encoded["input_ids"].to(device),
        attention_mask=encoded["attention_mask"].to(device),
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # Sharded forwards are collectives: a rank that finished early must keep stepping with the others.
        synced_gpus=engine.world_size > 1,
    ).cpu()
    prompt_length = encoded["input_ids"].size(1)
    response = output[:, prompt_length:]
    is_eos = response == tokenizer.eos_token_id
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0  # positions after the first EOS
    response_mask = (~after_eos).long()
    texts = [tokenizer.decode(row[mask.bool()], skip_special_tokens=True) for row, mask in zip(response, response_mask)]
    return RolloutBatch(
        input_ids=output,
        attention_mask=torch.cat([encoded["attention_mask"], response_mask], dim=1),
        response_mask=response_mask,
        prompt_length=prompt_length,
        responses=texts,
    )


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` used them."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def response_log_probs(module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                       temperature: float) -> torch.Tensor:
    """Log-probability of each response token under ``module`` (logits scaled by the sampling temperature)."""
    logits = module(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids(attention_mask)).logits
    logits = logits[:, prompt_length - 1:-1].float() / temperature
    targets = input_ids[:, prompt_length:]
    return torch.gather(F.log_softmax(logits, dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)


def batched_log_probs(engine, batch: RolloutBatch, micro_batch_size: int, temperature: float) -> torch.Tensor:
    """Forward-only log-probs of a whole rollout, in micro-batches, returned on the host."""
    device = engine.backend.device()
    chunks = []
    with torch.no_grad():
        for start in range(0, len(batch), micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            chunks.append(response_log_probs(engine.module, batch.input_ids[rows].to(device),
                                             batch.attention_mask[rows].to(device), batch.prompt_length,
                                             temperature).cpu())
    return torch.cat(chunks)
