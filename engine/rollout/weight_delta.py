"""Exact delta weight sync (``rollout.vllm.weight_sync=delta``): a push carries only the elements that changed since
the engine's last copy, as flat indices and new values, and the receiver writes them into that copy.

Exact by construction: elements are compared and copied as integers of the same width (``bits``), so -0.0 against
0.0, one NaN payload against another and any subnormal count as what they are, and the receiver's copy ends equal to
the sender's tensor bit for bit. A tensor whose delta would not be smaller than the tensor itself goes whole. The
sender keeps a copy of what the engine last received (``SentCopy``), the receiver its own (``ReceivedCopy``; a
colocated engine shares the sender's, one process holds one copy); dropping the sender's (``SentCopy.drop``: a server
restarted, another trainer pushed) makes the next push whole. Pure torch on whatever device the tensors are on.
"""

from __future__ import annotations

import dataclasses

import torch

_INTEGER_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s elements, flat, as integers of the same width: a view (no copy) of a contiguous tensor."""
    flat = tensor.reshape(-1)
    if tensor.dtype == torch.bool:
        return flat.view(torch.uint8)
    return flat.view(_INTEGER_OF_WIDTH[tensor.element_size()])


def index_dtype(numel: int) -> torch.dtype:
    """int32 positions where they fit (half the bytes of int64 on the wire)."""
    return torch.int32 if numel < 2**31 else torch.int64


@dataclasses.dataclass
class Delta:
    """The elements of one tensor (``shape``, ``dtype``) that changed: flat ``indices`` and their new ``values``."""

    indices: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.indices.numel() * self.indices.element_size() + self.values.numel() * self.values.element_size()


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def encode(new: torch.Tensor, old: torch.Tensor | None) -> tuple[Delta | None, int]:
    """The delta taking ``old`` to ``new`` (None when the whole tensor is the smaller message, or ``old`` is no usable
    copy: none, another shape or dtype) and how many elements changed (all of them without a usable copy). The
    changed elements are counted before their positions are taken: a tensor that goes whole costs no extraction."""
    if old is None or old.shape != new.shape or old.dtype != new.dtype:
        return None, new.numel()
    new_bits = bits(new.contiguous())
    differs = new_bits != bits(old)
    changed = int(differs.sum())
    positions = index_dtype(new.numel())
    per_element = torch.empty((), dtype=positions).element_size() + new.element_size()
    if changed * per_element >= nbytes(new):
        return None, changed
    where = differs.nonzero().reshape(-1)
    return Delta(where.to(positions), new_bits[where].view(new.dtype), tuple(new.shape)), changed


def apply(target: torch.Tensor, delta: Delta) -> torch.Tensor:
    """Write ``delta`` into ``target`` (contiguous, in place, as integers: bit-exact); returns ``target``."""
    if tuple(target.shape) != tuple(delta.shape) or target.dtype != delta.values.dtype:
        raise ValueError(f"a weight delta of {tuple(delta.shape)} {delta.values.dtype} cannot apply to a copy of "
                         f"{tuple(target.shape)} {target.dtype}")
    if not target.is_contiguous():
        raise ValueError("a weight delta applies to a contiguous copy only")
    positions = delta.indices.to(device=target.device, dtype=torch.long)
    bits(target)[positions] = bits(delta.values.to(target.device))
    return target


@dataclasses.dataclass
class PushStats:
    """One push's figures: bytes put on the wire, elements sent as changed, elements in the model."""

    wire_bytes: int = 0
    changed: int = 0
    elements: int = 0

    @property
    def changed_frac(self) -> float:
        return self.changed / self.elements if self.elements else 0.0


class SentCopy:
    """The sender's copy of what the engine last received, and the message for each new tensor."""

    def __init__(self) -> None:
        self.copy: dict[str, torch.Tensor] = {}
        self.stats = PushStats()

    def drop(self) -> None:
        """Forget the engine's copy: the next push sends every tensor whole."""
        self.copy.clear()

    def start(self) -> None:
        self.stats = PushStats()

    def message(self, name: str, tensor: torch.Tensor) -> torch.Tensor | Delta:
        """What to send for ``name`` now: a ``Delta`` against the engine's copy, or the tensor itself; the copy is
        brought to ``tensor`` either way."""
        tensor = tensor.detach()
        old = self.copy.get(name)
        delta, changed = encode(tensor, old)
        self.stats.elements += tensor.numel()
        self.stats.changed += changed
        if old is None or old.shape != tensor.shape or old.dtype != tensor.dtype:
            self.copy[name] = tensor.contiguous().clone()
        elif changed:  # the receiver scatters the delta; here a straight copy of the bits is cheaper and the same
            bits(old).copy_(bits(tensor.contiguous()))
        self.stats.wire_bytes += nbytes(tensor) if delta is None else delta.nbytes
        return tensor if delta is None else delta


class ReceivedCopy:
    """The receiver's copy of every tensor it was sent, kept up to date by whole tensors and deltas."""

    def __init__(self) -> None:
        self.copy: dict[str, torch.Tensor] = {}

    def take(self, name: str, message: torch.Tensor | Delta, device: torch.device | None = None) -> torch.Tensor:
        """The current tensor ``name`` after ``message`` (kept; the caller may read it until the next message)."""
        if not isinstance(message, Delta):
            self.copy[name] = message.to(device or message.device).contiguous()
            return self.copy[name]
        held = self.copy.get(name)
        if held is None:
            raise ValueError(f"received a delta for weight {name!r} without an earlier copy of it (a restarted "
                             "engine gets a full push first): restart the trainer's push from a full one")
        return apply(held, message)
