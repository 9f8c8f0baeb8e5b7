"""What a report card's properties need to know about the card they run in, without a parameter in every check's
signature: the precision the engine trains in (``fp32`` or ``bf16``), and how to join torch's fake process group.

The fake group (``torch.testing._internal.distributed.fake_pg``) lets one process act as rank 1 of 2 on one
device: its collectives complete without moving data, so only what a rank does with its own shards is measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..base import DeviceBackend

PRECISIONS = ("fp32", "bf16")
_current = ["fp32"]


def current_precision() -> str:
    """The precision the card runs in (``fp32`` outside a card)."""
    return _current[-1]


@contextlib.contextmanager
def precision(name: str) -> Iterator[None]:
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r}: choose from {', '.join(PRECISIONS)}")
    _current.append(name)
    try:
        yield
    finally:
        _current.pop()


def join_fake_group(backend: DeviceBackend, rank: int, world_size: int) -> DeviceBackend:
    """This process as ``rank`` of ``world_size`` on torch's fake group, bound to the backend's first device.

    The backend instance is told its group is the fake one (``dist_backend``), so that an engine built on it joins
    this group instead of refusing it; use it in a process of its own."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if backend.device_type != "cpu":
        backend.set_device(0)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    backend.dist_backend = "fake"
    return backend


_rollout: list[str | None] = [None]
_at_end: list = []


def current_rollout_engine() -> str | None:
    """The rollout engine the card certifies (``--rollout ENGINE``); ``None`` on the trainer's card."""
    return _rollout[-1]


@contextlib.contextmanager
def rollout_engine(name: str | None) -> Iterator[None]:
    """The card's rollout engine while its properties run; what they registered with ``at_card_end`` runs after
    them (an engine's servers and processes closed while the process group still exists)."""
    _rollout.append(name)
    try:
        yield
    finally:
        _rollout.pop()
        while _at_end:
            _at_end.pop()()


def at_card_end(callback) -> None:
    """Call ``callback()`` when the card's properties in this process have run."""
    _at_end.append(callback)
