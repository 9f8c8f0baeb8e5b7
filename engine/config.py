"""``EngineConfig``: every engine option in one dataclass, checked before any process group or model work."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from accel_backends.names import did_you_mean

GRAD_SYNC_MODES = ("auto", "deferred", "every_micro_batch")
OPTIMIZER_ONLOAD_MODES = ("mode", "step")
GENERATE_GATHER_MODES = ("once", "per_layer")
MIXED_PRECISION_MODES = ("auto", "fp32", "bf16", "fp16")
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclasses.dataclass
class EngineConfig:
    """How to shard, train and offload a model. Defaults are the fast, memory-hungry choices.

    fsdp_version: 1 (``FullyShardedDataParallel``) or 2 (``fully_shard``).
    param_offload / optimizer_offload: keep parameters / optimizer state in host memory outside ``train_mode``
        and ``eval_mode``; they are moved to the device on entry and back on exit.
    optimizer_onload: with ``optimizer_offload``, when optimizer state comes to the device: ``"mode"`` for the
        whole ``train_mode``, ``"step"`` only inside ``optimizer_step()`` (less device memory in forward/backward).
    grad_sync: ``"deferred"`` reduces gradients once per mini-batch (on the last micro-batch; each rank holds
        unsharded gradients until then); ``"every_micro_batch"`` reduces after each one (less memory, more
        communication); ``"auto"`` picks deferred when those unsharded gradients fit the device's free memory.
    grad_sync_margin: the fraction of free device memory ``"auto"`` keeps in reserve (activations, allocator
        fragmentation) when deciding whether deferred sync fits.
    generate_gather: ``"once"`` gathers every sharded unit once per ``generate()`` call and once per forward-only
        pass over a step's micro-batches (old, reference and teacher log-probs), with no FSDP hook per forward (one
        unsharded copy of the model meanwhile); ``"per_layer"`` gathers each layer for every forward (less memory,
        far more all-gathers).
    keep_params_unsharded: FSDP2 only. Keep parameters gathered between the micro-batches of one mini-batch:
        fewer all-gathers, the memory of one unsharded copy of the model.
    mixed_precision: ``"auto"`` computes in the backend's preferred dtype (bf16 on accelerators, fp32 on the CPU);
        gradients are reduced in fp32 whenever parameters are cast.
    lora_rank: > 0 wraps the model with PEFT LoRA (only adapter weights train). A model already wrapped by PEFT
        is used as it is.
    lr_schedule: ``"constant"``, ``"linear"`` or ``"cosine"``, after ``warmup_steps`` of linear warm-up; decays need
        ``total_steps`` and end at ``lr * min_lr_ratio``.
    max_grad_norm: clip the global gradient norm to this (``None``: measure, do not clip).
    wrap_class_names: decoder-layer classes to shard as units; ``None`` reads the model's ``_no_split_modules``.
    load_on_rank0: for a model given as a path or a factory, only rank 0 builds the weights; the other ranks
        build on the meta device and receive their shards from rank 0 (host memory: a shard, not the model).
    frozen: forward only (a reference model): no optimizer, no gradients; ``param_offload`` still applies.
    attn_implementation: the transformers attention implementation models are loaded with (``"sdpa"``,
        ``"eager"``, ``"flash_attention_2"``, a registered custom one); ``None`` asks the backend
        (``DeviceBackend.attention_implementation``), except that flash-attention kernels, which need half
        precision, become ``"sdpa"`` when the compute dtype is fp32.
    wrap_single_rank: at world size 1 with fp32 compute there is nothing to shard and no dtype to cast, so by
        default (``False``) the model runs without an FSDP wrapper: FSDP's hooks would only add work (about a
        quarter of a small model's GRPO step on the CPU). ``True`` wraps it anyway (e.g. to exercise FSDP with
        one process). With a cast compute dtype (bf16) the model is always wrapped: FSDP does the casting.
    sequence_parallel_size: ranks that share each micro-batch, each holding a slice of its tokens (Ulysses: an
        all-to-all around every attention layer; ``docs/sequence-parallel.md``). It must divide the world size and
        the model's attention heads; FSDP still shards over every rank, data parallelism runs over
        ``world / sequence_parallel_size`` groups. 1 (the default): off.
    """

    fsdp_version: int = 2
    param_offload: bool = False
    optimizer_offload: bool = False
    optimizer_onload: str = "mode"
    grad_sync: str = "auto"
    grad_sync_margin: float = 0.2
    generate_gather: str = "once"
    keep_params_unsharded: bool = False
    mixed_precision: str = "auto"
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr_ratio: float = 0.0
    max_grad_norm: float | None = 1.0
    seed: int = 0
    wrap_class_names: tuple[str, ...] | None = None
    dist_timeout_s: float = 1800.0
    frozen: bool = False
    load_on_rank0: bool = True
    wrap_single_rank: bool = False
    attn_implementation: str | None = None
    sequence_parallel_size: int = 1

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ValueError("invalid EngineConfig: " + "; ".join(problems))

    def _problems(self):
        if self.fsdp_version not in (1, 2):
            yield f"fsdp_version must be 1 or 2, got {self.fsdp_version!r}"
        if self.grad_sync not in GRAD_SYNC_MODES:
            yield f"grad_sync must be one of {', '.join(GRAD_SYNC_MODES)}, got {self.grad_sync!r}"
        if not 0.0 <= self.grad_sync_margin < 1.0:
            yield f"grad_sync_margin is a fraction of free device memory in [0, 1), got {self.grad_sync_margin!r}"
        if self.optimizer_onload not in OPTIMIZER_ONLOAD_MODES:
            yield (f"optimizer_onload must be one of {', '.join(OPTIMIZER_ONLOAD_MODES)}, "
                   f"got {self.optimizer_onload!r}")
        if self.generate_gather not in GENERATE_GATHER_MODES:
            yield (f"generate_gather must be one of {', '.join(GENERATE_GATHER_MODES)}, "
                   f"got {self.generate_gather!r}")
        if self.keep_params_unsharded and self.fsdp_version != 2:
            yield "keep_params_unsharded is an FSDP2 option: set fsdp_version=2 or turn it off"
        if self.keep_params_unsharded and self.grad_sync != "deferred":
            yield ("keep_params_unsharded needs grad_sync='deferred' set explicitly (it keeps parameters between "
                   f"micro-batches), got grad_sync={self.grad_sync!r}")
        if self.mixed_precision not in MIXED_PRECISION_MODES:
            yield f"mixed_precision must be one of {', '.join(MIXED_PRECISION_MODES)}, got {self.mixed_precision!r}"
        if self.lr_schedule not in LR_SCHEDULES:
            yield f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}"
        if self.lr_schedule != "constant" and not (self.total_steps and self.total_steps > 0):
            yield f"lr_schedule={self.lr_schedule!r} decays over total_steps: set total_steps to a positive number"
        if self.lr <= 0:
            yield f"lr must be positive, got {self.lr!r}"
        if self.warmup_steps < 0:
            yield f"warmup_steps must be >= 0, got {self.warmup_steps!r}"
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            yield f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}"
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            yield f"max_grad_norm must be positive or None, got {self.max_grad_norm!r}"
        if self.lora_rank < 0:
            yield f"lora_rank must be >= 0, got {self.lora_rank!r}"
        if self.frozen and self.optimizer_offload:
            yield "a frozen engine has no optimizer: turn optimizer_offload off"
        if self.attn_implementation is not None and not (isinstance(self.attn_implementation, str)
                                                         and self.attn_implementation.strip()):
            yield f"attn_implementation must be a name or None, got {self.attn_implementation!r}"
        if isinstance(self.sequence_parallel_size, bool) or not isinstance(self.sequence_parallel_size, int) \
                or self.sequence_parallel_size < 1:
            yield f"sequence_parallel_size must be a whole number >= 1, got {self.sequence_parallel_size!r}"
        else:
            from .sequence_parallel.checks import config_problems

            yield from config_problems(self.sequence_parallel_size, fsdp_version=self.fsdp_version,
                                       attn_implementation=self.attn_implementation)
        if self.dist_timeout_s <= 0:
            yield f"dist_timeout_s must be positive, got {self.dist_timeout_s!r}"

    @property
    def offload_enabled(self) -> bool:
        return self.param_offload or self.optimizer_offload


def as_config(config: EngineConfig | Mapping[str, Any] | None) -> EngineConfig:
    """Accept an ``EngineConfig`` or a mapping of its fields (from YAML), and name unknown keys."""
    if config is None:
        return EngineConfig()
    if isinstance(config, EngineConfig):
        return config
    if isinstance(config, Mapping):
        fields = {f.name for f in dataclasses.fields(EngineConfig)}
        for key in config:
            if key not in fields:
                raise ValueError(f"unknown engine option {key!r}{did_you_mean(key, fields)}; valid options: "
                                 f"{', '.join(sorted(fields))}")
        return EngineConfig(**config)
    raise TypeError(f"config must be an engine.EngineConfig or a mapping, got {type(config).__name__}")
