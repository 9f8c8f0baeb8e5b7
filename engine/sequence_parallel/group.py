"""Which ranks share a micro-batch: consecutive groups of ``sequence_parallel_size`` ranks, made through the backend.

FSDP still shards parameters over every rank; data parallelism runs over the ``world / size`` groups: ranks
``[0, size)`` form data-parallel rank 0, ``[size, 2 size)`` rank 1, and so on. Every rank of a group must get the
same micro-batches (the recipe's planner gives them out by ``data_parallel_rank``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class SequenceParallel:
    """This rank's sequence-parallel group. ``size`` 1: no group, every rank is its own data-parallel rank."""

    size: int
    rank: int  # within the group: which slice of each micro-batch this rank holds
    data_parallel_rank: int
    data_parallel_size: int
    group: Any = None  # the process group (None when size is 1)
    backend: Any = None  # the DeviceBackend whose all_to_all the exchange calls

    @property
    def enabled(self) -> bool:
        return self.size > 1

    @classmethod
    def single(cls, rank: int, world_size: int) -> SequenceParallel:
        return cls(size=1, rank=0, data_parallel_rank=rank, data_parallel_size=world_size)

    @classmethod
    def create(cls, backend, size: int) -> SequenceParallel:
        """The group of consecutive ranks this rank belongs to. A collective: every rank calls it (each makes every
        group, in the same order, as process groups require)."""
        rank, world = dist.get_rank(), dist.get_world_size()
        if size == 1:
            return cls.single(rank, world)
        mine = None
        for first in range(0, world, size):
            group = backend.new_group(list(range(first, first + size)))
            if first <= rank < first + size:
                mine = group
        return cls(size=size, rank=rank % size, data_parallel_rank=rank // size, data_parallel_size=world // size,
                   group=mine, backend=backend)

    def group_sum(self, value: torch.Tensor | float, device: torch.device | None = None) -> torch.Tensor:
        """``value`` summed over the group (no gradient): the totals a loss normaliser must count once per group,
        when they are not known before splitting (they usually are: the layout of the whole micro-batch)."""
        tensor = torch.as_tensor(value, dtype=torch.float32, device=device).detach().clone()
        if self.enabled:
            dist.all_reduce(tensor, group=self.group)
        return tensor
