"""Tiny Hugging Face models built from a config (no downloads) and token data for engine tests."""

import torch
import torch.nn.functional as F

from engine.tiny_model import UNEVEN

VOCAB = 96


SIZE = {"vocab_size": VOCAB, "hidden_size": 64, "layers": 2, "max_positions": 64}
UNEVEN_SIZE = {**UNEVEN, "layers": 2, "max_positions": 64}  # dims 2 and 3 ranks do not divide: padded shards


def qwen2_config():
    from engine.tiny_model import tiny_qwen2_config

    return tiny_qwen2_config(**SIZE)


def tiny_qwen2():
    """Same weights on every call (and every rank): the seed is set here."""
    from engine.tiny_model import tiny_qwen2 as build

    return build(seed=1234, **SIZE)


def tiny_uneven_qwen2():
    """``tiny_qwen2`` with dims the world size does not divide (``UNEVEN_SIZE``)."""
    from engine.tiny_model import tiny_qwen2 as build

    return build(seed=1234, **UNEVEN_SIZE)


def make_micro_batches(seed, count, batch=2, length=12):
    """Token micro-batches with different numbers of real tokens (so their weights differ)."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for i in range(count):
        ids = torch.randint(0, VOCAB, (batch, length), generator=g)
        valid = torch.ones(batch, length, dtype=torch.long)
        cut = 3 + (seed * 7 + i * 5) % (length - 4)
        valid[0, cut:] = 0  # the first row is padded from a position that varies per micro-batch
        batches.append({"input_ids": ids, "attention_mask": valid})
    return batches


def token_loss(module, batch):
    """Mean next-token cross-entropy over real tokens; weight = their number."""
    device = next(p for p in module.parameters()).device
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    logits = module(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    count = (targets != -100).sum()
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
    return loss, count


def reference_grads(micro_batches_per_rank, model=None):
    """Single-process gradients of one pass over every rank's micro-batches, weighted by token count."""
    model = model if model is not None else tiny_qwen2()
    all_batches = [b for batches in micro_batches_per_rank for b in batches]
    total = sum(token_loss(model, b)[1] for b in all_batches)
    for b in all_batches:
        loss, count = token_loss(model, b)
        (loss * count / total).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
