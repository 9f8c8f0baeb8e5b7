"""The sizes every RL step derives from ``train.*`` and ``rollout.n`` and the world size: prompts per rank,
sequences per optimizer update, updates per step (any RL config with those keys)."""

from __future__ import annotations

from ..train import config as train_config


def data_parallel_groups(config, world_size: int) -> int:
    """Ranks that sample their own prompts: the world, or its sequence-parallel groups (each group's ranks share
    the group's prompts and train on slices of the same sequences)."""
    return train_config.data_parallel_groups(config.engine, world_size)


def prompts_per_rank(config, world_size: int) -> int:
    """Prompts each rank draws per GRPO step (each sequence-parallel group, whose ranks draw the same)."""
    return config.train.prompts_per_step // data_parallel_groups(config, world_size)


def sequences_per_rank(config, world_size: int) -> int:
    """Sequences each rank rolls out per GRPO step (its prompts x ``rollout.n``)."""
    return prompts_per_rank(config, world_size) * config.rollout.n


def mini_batch_sequences(config, world_size: int) -> int:
    """Sequences per optimizer update over all ranks: ``prompts_per_update x n`` (the same on any number of
    ranks), or, from the deprecated per-rank ``mini_batch_size``, that times the world size (the number of
    sequence-parallel groups)."""
    t = config.train
    if t.mini_batch_size is not None:
        return t.mini_batch_size * data_parallel_groups(config, world_size)
    return (t.prompts_per_update or t.prompts_per_step) * config.rollout.n


def updates_per_step(config, world_size: int) -> int:
    """Optimizer steps per GRPO step: PPO epochs x mini-batches in the step's sequences (all ranks')."""
    sequences = config.train.prompts_per_step * config.rollout.n
    return config.train.ppo_epochs * max(1, sequences // mini_batch_sequences(config, world_size))
