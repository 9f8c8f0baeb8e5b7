"""The ``EngineConfig`` of an RL run's policy and of its frozen models, from the run's ``engine.*`` section."""

from __future__ import annotations

import dataclasses

from ..config import EngineConfig
from ..train import config as train_config
from .sizes import derived, updates_per_step

# What a frozen model keeps of the policy's engine options: how it is sharded and computes, not how it trains.
FROZEN_KEEPS = {"fsdp_version", "mixed_precision", "wrap_class_names", "dist_timeout_s", "seed", "lora_rank",
                "lora_alpha", "lora_target_modules", "attn_implementation", "sequence_parallel_size"}


def engine_config(config, world_size: int, frozen_offload: bool | None = None) -> EngineConfig:
    """The policy's engine settings; with ``frozen_offload`` (True or False) a frozen model's, its parameters in
    host memory between uses when True."""
    options = dict(config.engine)
    options.setdefault("seed", config.train.seed)
    # The schedule advances once per optimizer step, and an RL step may make several.
    options.setdefault("total_steps", config.train.steps * updates_per_step(config, world_size))
    if frozen_offload is not None:
        options = {k: v for k, v in options.items() if k in FROZEN_KEEPS}
        options.update(frozen=True, param_offload=frozen_offload)
    return train_config.engine_options(options, {})


def reward_model_engine(config, section):
    """The frozen engine options of ``reward_model.path`` sharded across the trainer's ranks (the policy's sharding
    and precision, without LoRA or sequence parallelism: each rank scores whole responses), or None: replicated."""
    import torch.distributed as dist

    from .scorers import shards_across_ranks

    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if not shards_across_ranks(section, world_size):
        return None
    options = engine_config(config, world_size, frozen_offload=bool(section.param_offload))
    return dataclasses.replace(options, lora_rank=0, sequence_parallel_size=1)


def resolved(config, world_size: int) -> dict:
    """The whole configuration as a run uses it: every option, every engine default, and the derived values."""
    data = config.to_dict()
    data["engine"] = dataclasses.asdict(engine_config(config, world_size))
    data["derived"] = derived(config, world_size)
    return data
