"""The chunked LM head (engine/rl/logprobs.py through engine/output_layer.py): log-probs and entropy of a packed
micro-batch computed a slice of positions at a time inside the model's forward, so no ``[tokens, vocabulary]``
tensor ever exists, equal to the same computation over all positions at once, with gradients."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine import output_layer
from engine.packing import SequenceBatch, build_layout, register_packed_sdpa
from engine.rl.logprobs import sequence_log_probs
from engine.tiny_model import tiny_qwen2

VOCAB, HIDDEN = 4099, 32


class LargestVocabularyTensor(TorchDispatchMode):
    """The most positions any tensor ending in the vocabulary's dimension held (logits, their softmax...; not the
    output layer's weight, ``[HIDDEN, VOCAB]`` when transposed for the matrix product)."""

    def __init__(self):
        super().__init__()
        self.rows = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.dim() and tensor.shape[-1] == VOCAB \
                    and tuple(tensor.shape) != (HIDDEN, VOCAB):
                self.rows = max(self.rows, tensor.numel() // VOCAB)
        return out


def _log_probs_and_grads(model, layout, rows_per_chunk, monkeypatch):
    monkeypatch.setattr(output_layer, "ROWS_PER_CHUNK", rows_per_chunk)
    model.zero_grad()
    with LargestVocabularyTensor() as largest:
        log_probs, entropy = sequence_log_probs(model, layout, 0.7, with_entropy=True, entropy_grad=True)
        weights = torch.linspace(-1.0, 1.0, log_probs.numel()).view_as(log_probs)
        ((log_probs * weights).sum() + 0.1 * entropy.sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return log_probs.detach(), entropy.detach(), grads, largest.rows


def test_chunked_head_equals_all_positions_at_once_and_never_holds_them_all(monkeypatch):
    model = tiny_qwen2(seed=0, vocab_size=VOCAB, hidden_size=HIDDEN, layers=2, max_positions=64,
                       attn_implementation=register_packed_sdpa())
    g = torch.Generator().manual_seed(0)
    batch = SequenceBatch.from_parts([torch.randint(0, VOCAB, (n,), generator=g) for n in (3, 5, 2, 4)],
                                     [torch.randint(0, VOCAB, (n,), generator=g) for n in (9, 4, 11, 6)])
    layout = build_layout(batch, [0, 1, 2, 3], packed=True)
    tokens = len(layout.targets)  # 30 scored positions
    whole = _log_probs_and_grads(model, layout, tokens, monkeypatch)  # one slice: every position at once
    chunked = _log_probs_and_grads(model, layout, 7, monkeypatch)  # 5 slices, the last one ragged
    assert whole[3] == tokens and chunked[3] == 7  # the chunked pass never held more than one slice's logits
    assert torch.allclose(chunked[0], whole[0], rtol=0, atol=1e-6)
    assert torch.allclose(chunked[1], whole[1], rtol=0, atol=1e-6)
    for name, grad in whole[2].items():
        assert torch.allclose(chunked[2][name], grad, rtol=0, atol=1e-6), name
    # Both against the full-vocabulary log-softmax of the model's own logits, in float64.
    with torch.no_grad():
        logits = model.double()(**layout.inputs, logits_to_keep=layout.logits_to_keep, use_cache=False).logits
    full = torch.log_softmax(layout.select(logits) / 0.7, dim=-1)
    want = layout.to_rows(full.gather(-1, layout.targets.unsqueeze(-1)).squeeze(-1))
    assert torch.allclose(chunked[0].double(), want, rtol=0, atol=1e-5)
    assert torch.allclose(chunked[1].double(), layout.to_rows(-(full.exp() * full).sum(-1)), rtol=0, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 30])
def test_every_slice_size_gives_the_same_log_probs(monkeypatch, rows):
    model = tiny_qwen2(seed=1, vocab_size=VOCAB, hidden_size=HIDDEN, layers=1, max_positions=64)
    g = torch.Generator().manual_seed(2)
    batch = SequenceBatch.from_parts([torch.randint(0, VOCAB, (n,), generator=g) for n in (2, 6)],
                                     [torch.randint(0, VOCAB, (n,), generator=g) for n in (12, 5)])
    layout = build_layout(batch, [0, 1], packed=True)
    monkeypatch.setattr(output_layer, "ROWS_PER_CHUNK", 4)
    with torch.no_grad():
        reference = sequence_log_probs(model, layout, 1.0)
        monkeypatch.setattr(output_layer, "ROWS_PER_CHUNK", rows)
        got = sequence_log_probs(model, layout, 1.0)
    assert torch.allclose(got, reference, rtol=0, atol=1e-6)
