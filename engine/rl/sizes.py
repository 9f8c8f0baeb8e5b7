"""The sizes every RL step derives from ``train.*`` and ``rollout.n`` and the world size: prompts per rank,
sequences per optimizer update, updates per step (any RL config with those keys)."""

from __future__ import annotations

from ..train import config as train_config


def data_parallel_groups(config, world_size: int) -> int:
    """Ranks that sample their own prompts: the world, or its sequence-parallel groups (each group's ranks share
    the group's prompts and train on slices of the same sequences)."""
    return train_config.data_parallel_groups(config.engine, world_size)


def prompts_per_rank(config, world_size: int) -> int:
    """Prompts each rank draws per RL step (each sequence-parallel group, whose ranks draw the same)."""
    return config.train.prompts_per_step // data_parallel_groups(config, world_size)


def sequences_per_rank(config, world_size: int) -> int:
    """Sequences each rank rolls out per RL step (its prompts x ``rollout.n``)."""
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
    """Optimizer steps per RL step: PPO epochs x mini-batches in the step's sequences (all ranks')."""
    sequences = config.train.prompts_per_step * config.rollout.n
    return config.train.ppo_epochs * max(1, sequences // mini_batch_sequences(config, world_size))


def prompt_token_limit(config) -> int | None:
    """The longest prompt a run can see, in tokens, when known before any data is read: ``data.max_prompt_tokens``,
    or the built-in echo task's longest prompt (one token per character at most)."""
    if config.data.max_prompt_tokens:
        return config.data.max_prompt_tokens
    if not (config.data.path or config.data.val_path) and config.data.task == "echo":
        from .prompts import EchoTask

        return EchoTask().longest_prompt_chars()
    return None


def max_sequence_tokens(config) -> int | None:
    """The longest prompt + response a run can see, when the prompt limit is known before any data is read."""
    limit = prompt_token_limit(config)
    return None if limit is None else limit + config.rollout.max_new_tokens


def derived(config, world_size: int) -> dict:
    """The values that follow from the options and the world size (``--print-config``, ``config.json``); with
    vLLM servers, what ``rollout.vllm.borrow_threads`` comes to on this host (``borrow_threads``)."""
    from ..rollout.borrowing import shown_borrowing

    borrowing = shown_borrowing(config.rollout, world_size)
    return {
        "world_size": world_size,
        "prompts_per_rank": prompts_per_rank(config, world_size),
        "sequences_per_rank": sequences_per_rank(config, world_size),
        "sequences_per_update": mini_batch_sequences(config, world_size),  # over all ranks
        "micro_batch_tokens_per_rank": config.train.micro_batch_tokens,
        "micro_batch_size_per_rank": None if config.train.micro_batch_tokens else config.train.micro_batch_size,
        "optimizer_steps_per_step": updates_per_step(config, world_size),
        "total_optimizer_steps": config.train.steps * updates_per_step(config, world_size),
        **({"borrow_threads": borrowing} if borrowing else {}),
    }
