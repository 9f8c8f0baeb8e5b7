"""Log-probs of the response tokens: equal to the naive full log-softmax, at a fraction of its peak memory."""

import importlib.util

import pytest
import torch
from conftest import REPO

from engine import output_layer
from engine.rl.logprobs import token_log_probs

_spec = importlib.util.spec_from_file_location("logprob_memory", REPO / "tests" / "scripts" / "logprob_memory.py")
logprob_memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(logprob_memory)


def test_slices_equal_the_full_log_softmax_with_gradients_and_entropy(monkeypatch):
    monkeypatch.setattr(output_layer, "ROWS_PER_CHUNK", 5)  # slices that cross sequences, a ragged last one
    logits = torch.randn(3, 12, 50, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (3, 12))
    full = torch.log_softmax(logits / 0.7, -1)
    want = full.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    got, entropy = token_log_probs(logits, targets, 0.7, with_entropy=True)
    assert torch.allclose(got, want.float(), atol=1e-5) and not entropy.requires_grad
    assert torch.allclose(entropy, -(full.exp() * full).sum(-1).float(), atol=1e-5)
    weights = torch.randn(3, 12)
    (grad_got,) = torch.autograd.grad((got * weights).sum(), logits)
    (grad_want,) = torch.autograd.grad((want * weights).sum(), logits)
    assert torch.allclose(grad_got, grad_want, atol=1e-5)


@pytest.mark.parametrize("rows_per_slice", [5, 256], ids=["recomputed-slices", "one-slice"])
def test_entropy_with_gradient_for_the_entropy_bonus(monkeypatch, rows_per_slice):
    monkeypatch.setattr(output_layer, "ROWS_PER_CHUNK", rows_per_slice)
    logits = torch.randn(3, 12, 50, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (3, 12))
    full = torch.log_softmax(logits / 0.7, -1)
    want_lp = full.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    want_entropy = -(full.exp() * full).sum(-1)
    got_lp, got_entropy = token_log_probs(logits, targets, 0.7, with_entropy=True, entropy_grad=True)
    assert got_entropy.requires_grad and torch.allclose(got_entropy, want_entropy.float(), atol=1e-5)
    a, b = torch.randn(3, 12), torch.randn(3, 12)
    (grad_got,) = torch.autograd.grad((got_lp * a + got_entropy * b).sum(), logits)
    (grad_want,) = torch.autograd.grad((want_lp * a + want_entropy * b).sum(), logits)
    assert torch.allclose(grad_got, grad_want, atol=1e-5)


@pytest.mark.parametrize("grad", [False, True], ids=["forward-only", "policy-with-backward"])
def test_peak_memory_is_at_most_half_of_the_naive_pass(grad, monkeypatch):
    """A CI-sized version of the documented measurement (tests/scripts/logprob_memory.py, docs/grpo.md).

    There, 8 x 256 response positions make 8 slices of 256 (rows_per_slice); here 4 x 64 positions are cut in the
    same proportion (8 slices of 32), so the saving measured is the one the documented size gets.
    """
    monkeypatch.setattr(output_layer, "ROWS_PER_CHUNK", 32)
    torch.set_num_threads(1)
    naive = logprob_memory.measure("naive", vocab=32000, batch=4, prompt=16, response=64, grad=grad)
    chunked = logprob_memory.measure("chunked", vocab=32000, batch=4, prompt=16, response=64, grad=grad)
    diff = (torch.tensor(naive["values"]) - torch.tensor(chunked["values"])).abs().max().item()
    print(f"peak MiB naive {naive['peak_bytes'] / 2**20:.1f}, chunked {chunked['peak_bytes'] / 2**20:.1f}")
    assert diff < 1e-5
    assert naive["peak_bytes"] > 30 * 2**20, "the naive pass must show its [B, R, V] tensors"
    assert chunked["peak_bytes"] <= 0.5 * naive["peak_bytes"]
