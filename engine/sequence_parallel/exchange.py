"""The Ulysses all-to-all: trade a split along one axis for a split along another, differentiably.

Before attention each rank holds all heads of its slice of tokens; ``exchange(x, scatter_dim=heads,
gather_dim=tokens)`` gives it ``heads / size`` heads of all the group's tokens. After attention the inverse exchange
brings each rank's tokens back with all heads. The backward of an exchange is the inverse exchange of the gradient,
so gradients summed over the group's ranks are those of the unsplit model. The collective is the backend's
``all_to_all`` (one call per exchange).
"""

from __future__ import annotations

import torch


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, size: int, group, backend) -> torch.Tensor:
    send = torch.stack(x.chunk(size, dim=scatter_dim))  # [size, ...]: chunk i goes to rank i (one contiguous copy)
    received = torch.empty_like(send)
    backend.all_to_all(received, send, group)
    return torch.cat(received.unbind(0), dim=gather_dim)  # rank i's chunk in the i-th place along gather_dim


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, size, group, backend):
        ctx.args = (scatter_dim, gather_dim, size, group, backend)
        return _all_to_all(x, scatter_dim, gather_dim, size, group, backend)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim, size, group, backend = ctx.args
        return _all_to_all(grad, gather_dim, scatter_dim, size, group, backend), None, None, None, None, None


def exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int, sp) -> torch.Tensor:
    """``x`` split in ``sp.size`` chunks along ``scatter_dim`` (sent one to each rank of ``sp.group``), the chunks
    received concatenated along ``gather_dim`` in rank order. ``sp``: a ``SequenceParallel``."""
    return _Exchange.apply(x, scatter_dim, gather_dim, sp.size, sp.group, sp.backend)
