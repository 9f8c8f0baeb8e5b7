"""Exact delta weight sync's encoding (engine/rollout/weight_delta.py): after every message the receiver's copy is the
sender's tensor bit for bit, whatever the dtype and whatever odd values (-0.0, NaNs with payloads); a tensor whose
delta would not be smaller travels whole; a dropped sender copy makes the next push whole."""

from __future__ import annotations

import pytest
import torch

from engine.rollout import weight_delta
from engine.rollout.weight_delta import Delta, ReceivedCopy, SentCopy, bits


def _adam_like_steps(tensor: torch.Tensor, steps: int, generator: torch.Generator, lr: float):
    """Successive versions of ``tensor`` moved by small sign-like updates (some elements round back to the same
    value at low precision, as Adam's do)."""
    master = tensor.float().clone()
    for _ in range(steps):
        master -= lr * torch.randn(master.shape, generator=generator).sign()
        yield master.to(tensor.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_many_random_steps_leave_the_receiver_bit_equal(dtype):
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(64, 48, generator=generator).to(dtype)
    sender, receiver = SentCopy(), ReceivedCopy()
    kinds = []
    for step, version in enumerate(_adam_like_steps(start, 30, generator, lr=1e-4)):
        sender.start()
        message = sender.message("w", version)
        kinds.append(type(message).__name__)
        got = receiver.take("w", message)
        assert torch.equal(bits(got), bits(version)), step
        assert torch.equal(bits(sender.copy["w"]), bits(version)), step
        if isinstance(message, Delta):
            changed = int((bits(version) != bits(receiver.copy["w"])).sum())  # nothing left to send
            assert changed == 0 and sender.stats.wire_bytes == message.nbytes < weight_delta.nbytes(version)
    assert kinds[0] == "Tensor"  # the first push is whole
    if dtype == torch.float32:
        assert "Delta" not in kinds  # every fp32 element moves each step: the delta is larger, whole wins
    else:
        assert "Delta" in kinds  # most bf16/fp16 elements round back to their old value at this step size


def test_negative_zero_and_nan_payloads_are_sent_as_bits():
    old = torch.tensor([0.0, 1.0, float("nan"), 2.0] + [3.0] * 60)
    new = old.clone()
    new[0] = -0.0  # equal as floats, different bits
    bits(new)[2] = bits(torch.tensor([float("nan")]))[0] ^ 1  # another NaN payload
    delta, changed = weight_delta.encode(new, old)
    assert delta is not None and delta.indices.tolist() == [0, 2] and changed == 2
    target = old.clone()
    weight_delta.apply(target, delta)
    assert torch.equal(bits(target), bits(new))
    same, changed = weight_delta.encode(new, new.clone())
    assert changed == 0 and same.indices.numel() == 0  # the same NaN bits: nothing to send


def test_a_delta_larger_than_the_tensor_falls_back_to_the_whole_tensor():
    old = torch.zeros(10, dtype=torch.bfloat16)
    new = old.clone()
    new[:3] = 1.0  # 3 x (4 + 2) = 18 bytes < 20: a delta
    assert isinstance(weight_delta.encode(new, old)[0], Delta)
    new[:4] = 1.0  # 4 x 6 = 24 bytes >= 20: whole
    assert weight_delta.encode(new, old) == (None, 4)
    sender = SentCopy()
    sender.message("w", old)
    sender.start()
    message = sender.message("w", new)
    assert not isinstance(message, Delta) and torch.equal(bits(message), bits(new))
    assert sender.stats.wire_bytes == 20 and sender.stats.changed_frac == 0.4  # sent whole, 4 of 10 changed


def test_dropping_the_senders_copy_makes_the_next_push_whole_and_a_fresh_receiver_refuses_a_delta():
    old = torch.zeros(100)
    new = old.clone()
    new[5] = 1.0
    sender = SentCopy()
    sender.message("w", old)
    assert isinstance(sender.message("w", new), Delta)
    with pytest.raises(ValueError, match="without an earlier copy"):
        ReceivedCopy().take("w", sender.message("w", new + 0 * new))  # an empty delta to a fresh receiver
    sender.drop()
    new[6] = 1.0
    assert not isinstance(sender.message("w", new), Delta)


def test_other_dtypes_and_shapes_travel_whole():
    sender = SentCopy()
    sender.message("w", torch.zeros(4, 4))
    assert not isinstance(sender.message("w", torch.zeros(4, 4, dtype=torch.bfloat16)), Delta)
    assert not isinstance(sender.message("w", torch.zeros(2, 8, dtype=torch.bfloat16)), Delta)
    step = torch.zeros(64, dtype=torch.int64)
    sender.message("n", step)
    step[3] = 7
    delta = sender.message("n", step)
    assert isinstance(delta, Delta) and delta.indices.tolist() == [3] and delta.values.tolist() == [7]
