"""the SFT objective's loss.py: the chunked loss and token accuracy equal the unchunked full-logits computation
(fp32), gradients included, for packed and padded micro-batches, several chunks (a ragged last one), the fused output
layer and the full-logits fallback, and with PEFT (LoRA) wrapping the model."""

import torch
import torch.nn.functional as F

from engine import output_layer
from engine.offline.masks import Tokenized
from engine.offline.objectives.sft import loss as sft_loss
from engine.offline.objectives.sft.trainer import token_loss
from engine.offline.sequences import MicroBatch, sequence_batch
from engine.packing import build_layout
from engine.tiny_model import tiny_qwen2

VOCAB = 384
LENGTHS = (9, 14, 6, 11)


def _micro(packed: bool) -> MicroBatch:
    generator = torch.Generator().manual_seed(3)
    items = []
    for length in LENGTHS:
        ids = torch.randint(0, VOCAB, (length,), generator=generator).tolist()
        mask = [0, 0, 0] + [1, 1, 0, 0, 1] * length  # a prompt, then supervised spans with gaps (multi-turn)
        items.append(Tokenized(ids, mask[:length], "t"))
    batch, masks = sequence_batch(items)
    layout = build_layout(batch, list(range(len(items))), packed=packed)
    return MicroBatch(layout, masks[layout.rows, batch.starts[layout.rows] + layout.columns])


def _unchunked(module, micro):
    """The SFT loss as computed before loss.py: full fp32 logits of every scored position at once."""
    layout, mask = micro.layout, micro.mask
    logits = layout.select(module(**layout.inputs, logits_to_keep=layout.logits_to_keep, use_cache=False).logits)
    logits = logits.float()
    per_token = F.cross_entropy(logits, layout.targets, reduction="none")
    loss = (per_token * mask).sum() / mask.sum()
    accuracy = ((logits.argmax(-1) == layout.targets).float() * mask).sum() / mask.sum()
    return loss, accuracy


def _loss_and_grads(module, fn, micro):
    module.zero_grad()
    loss, accuracy = fn(module, micro)
    loss.backward()
    return loss.detach(), float(accuracy), {n: p.grad.clone() for n, p in module.named_parameters()
                                            if p.grad is not None}


def _chunked(module, micro):
    loss, _, metrics = token_loss(module, micro, torch.device("cpu"))
    return loss, metrics["mean_token_accuracy"]


def _assert_same(module, micro):
    want_loss, want_accuracy, want_grads = _loss_and_grads(module, _unchunked, micro)
    got_loss, got_accuracy, got_grads = _loss_and_grads(module, _chunked, micro)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5, atol=0), (got_loss, want_loss)
    assert got_accuracy == want_accuracy
    assert sorted(got_grads) == sorted(want_grads) and want_grads
    for name, want in want_grads.items():
        assert torch.allclose(got_grads[name], want, rtol=1e-5, atol=1e-7), name


def test_chunked_loss_accuracy_and_gradients_equal_the_full_logits(monkeypatch):
    model = tiny_qwen2(seed=0, vocab_size=VOCAB, layers=1)
    calls = []
    real_checkpoint = output_layer.checkpoint
    monkeypatch.setattr(output_layer, "checkpoint", lambda *a, **k: calls.append(1) or real_checkpoint(*a, **k))
    monkeypatch.setattr(output_layer, "ROWS_PER_CHUNK", 7)  # several chunks, across sequences, a ragged last one
    for packed in (True, False):
        micro = _micro(packed)
        assert len(micro.layout.targets) > 3 * 7 and micro.mask.sum() > 0
        calls.clear()
        _assert_same(model, micro)
        assert len(calls) == -(-len(micro.layout.targets) // 7), "every chunk is checkpointed (recomputed)"
    model.config.logit_scale = 1.0  # not a plain linear head as far as loss.py knows: the full-logits fallback
    _assert_same(model, _micro(True))
    del model.config.logit_scale
    monkeypatch.setattr(output_layer, "ROWS_PER_CHUNK", None)  # one chunk for this vocabulary: nothing checkpointed
    calls.clear()
    _assert_same(model, _micro(True))
    assert not calls


def test_chunked_loss_under_peft_equals_the_full_logits(monkeypatch):
    from peft import LoraConfig, get_peft_model

    from engine.output_layer import plain_output_layer

    monkeypatch.setattr(output_layer, "ROWS_PER_CHUNK", 5)
    for targets, fused in ((["q_proj", "v_proj"], True), (["q_proj", "lm_head"], False)):  # a LoRA head: fallback
        model = get_peft_model(tiny_qwen2(seed=1, vocab_size=VOCAB, layers=1),
                               LoraConfig(r=4, target_modules=targets, init_lora_weights=False))
        assert (plain_output_layer(model) is not None) == fused
        _assert_same(model, _micro(True))


def test_chunk_size_follows_the_vocabulary():
    assert sft_loss.rows_per_chunk(151_936) == 512
    assert sft_loss.rows_per_chunk(VOCAB) == sft_loss.CHUNK_LOGITS // VOCAB
    assert sft_loss.rows_per_chunk(10**12) == 1
