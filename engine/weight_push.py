"""Pushing the trainer's weights to a rollout engine's copy of the model, for the report card (``engine/certify.py``).

A ``WeightTarget`` is anything that keeps its own copy of the policy: it loads named full tensors, gives them back,
and computes log-probs of given tokens. ``ModelCopy`` is the one of this process (a Hugging Face model on the
device, as a test double or a colocated engine would hold it); a wire to a separate engine (a vLLM server) is
another ``WeightTarget`` with the same three methods, so the card's properties run on it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import torch
import torch.nn as nn


class WeightTarget(Protocol):
    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take ``(name, full tensor)`` pairs, each valid only until the next one is produced (copy it)."""

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What the target holds now, by the same names."""

    def log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        """``[B, L - 1]`` float32: the log-prob of each next token of ``ids`` ``[B, L]``."""

    def describe(self) -> str:
        """A few words naming the target (for the card's detail column)."""


def token_log_probs(module: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``[B, L - 1]`` float32 log-probs of ``ids[:, 1:]`` under ``module`` (a plain or a sharded model)."""
    device = next(module.parameters()).device
    ids = ids.to(device)
    logits = module(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).cpu()


class ModelCopy:
    """The model built by ``factory`` on ``device``, its weights replaced by the pushed ones."""

    def __init__(self, factory: Callable[[], nn.Module], device: torch.device) -> None:
        self.model = factory().to(device).eval()
        self.device = device

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights:
                params[name].copy_(tensor)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in self.model.named_parameters():
            yield name, param.detach()

    def log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return token_log_probs(self.model, ids)

    def describe(self) -> str:
        return f"a model copy on {self.device} in this process"


def push(engine, target: WeightTarget) -> dict[str, torch.Tensor]:
    """Push ``engine``'s full weights into ``target`` (every rank: a collective); returns what was pushed, on the
    host."""
    sent: dict[str, torch.Tensor] = {}

    def recorded():
        for name, tensor in engine.iter_full_weights():
            sent[name] = tensor.detach().to("cpu", copy=True)
            yield name, tensor

    target.load(recorded())
    return sent
