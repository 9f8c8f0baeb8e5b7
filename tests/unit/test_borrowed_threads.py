"""``BorrowedThreads``: the trainer's intra-op pool widens while the servers idle and narrows while they sample,
at module granularity in the forward and the backward pass (``engine/runtime/borrowed_threads.py``)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from engine.runtime.borrowed_threads import BorrowedThreads, borrowing_problem


class Seen(nn.Module):
    """Records the pool size in its forward and in its backward (through an autograd function)."""

    def __init__(self, log: list, name: str, flip: dict | None = None) -> None:
        super().__init__()
        self.log, self.name, self.flip = log, name, flip
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        self.log.append((self.name, "forward", torch.get_num_threads()))
        if self.flip is not None:
            self.flip["busy"] = not self.flip["busy"]  # the servers start (or stop) sampling here
        return _Record.apply(self.linear(x), self.log, self.name)


class _Record(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log, name):
        ctx.log, ctx.name = log, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append((ctx.name, "backward", torch.get_num_threads()))
        return grad, None, None


@pytest.fixture
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def test_widens_while_idle_and_narrows_while_busy_in_forward_and_backward(one_thread):
    log, state = [], {"busy": False}
    # b's forward sets the servers sampling, so c runs narrow; they idle again before the backward, which widens
    # at its first gradient.
    a, b, c = Seen(log, "a"), Seen(log, "b", flip=state), Seen(log, "c")
    model = nn.Sequential(a, b, c)
    with BorrowedThreads(lambda: state["busy"], extra=1) as borrowing:
        assert torch.get_num_threads() == 2  # idle at start: widened at once
        out = model(torch.randn(3, 4, requires_grad=True))
        state["busy"] = False  # the batch is sampled before the backward begins
        out.sum().backward()
        switches = borrowing.switches
    assert torch.get_num_threads() == 1  # back to its size at start
    assert log == [("a", "forward", 2), ("b", "forward", 2), ("c", "forward", 1),
                   ("c", "backward", 2), ("b", "backward", 2), ("a", "backward", 2)]
    assert switches == 3  # widen at start, narrow before c, widen when c's gradient arrives


def test_hooks_are_removed_and_other_threads_do_not_switch(one_thread):
    log, state = [], {"busy": False}
    borrowing = BorrowedThreads(lambda: state["busy"], extra=1).start()
    seen = []
    worker = threading.Thread(target=lambda: (Seen(log, "w")(torch.randn(1, 4)), seen.append(borrowing.switches)))
    worker.start()
    worker.join()
    assert seen == [1]  # only the start's widening: the other thread's forward changed nothing
    borrowing.stop()
    state["busy"] = True
    Seen(log, "after")(torch.randn(1, 4))
    assert borrowing.switches == 1 and torch.get_num_threads() == 1  # no hook left behind


def test_refuses_negative_and_names_a_shared_core():
    with pytest.raises(ValueError, match=">= 0"):
        BorrowedThreads(lambda: False, extra=-1)
    assert borrowing_problem(1, base=1, cores=2, key="k") is None
    problem = borrowing_problem(1, base=1, cores=1, key="rollout.vllm.borrow_threads")
    assert "may use only 1 core" in problem and "rollout.vllm.borrow_threads=0" in problem
