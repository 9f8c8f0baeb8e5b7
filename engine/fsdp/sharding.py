"""Shard a model with FSDP1 or FSDP2, one unit per decoder layer plus the root, on the backend's device."""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn as nn

from ..config import EngineConfig
from . import private_state
from .rank0_loading import fingerprint as weights_fingerprint
from .rank0_loading import fsdp1_materializer

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(config: EngineConfig, backend) -> torch.dtype:
    """The dtype forward and backward run in: the backend's preference under ``"auto"``."""
    if config.mixed_precision == "auto":
        return backend.preferred_param_dtype
    return _DTYPES[config.mixed_precision]


def layer_classes(model: nn.Module, names: tuple[str, ...] | None) -> set[type]:
    """Classes to shard as units: ``names``, else every class listed in a submodule's ``_no_split_modules``."""
    wanted = set(names) if names else set()
    if not names:
        for module in model.modules():
            wanted.update(getattr(module, "_no_split_modules", None) or ())
    found = {type(m) for m in model.modules() if type(m).__name__ in wanted}
    missing = wanted - {cls.__name__ for cls in found}
    if names and missing:
        raise ValueError(f"wrap_class_names {sorted(missing)} match no module of {type(model).__name__}")
    if not found:
        warnings.warn(
            f"no decoder-layer class found in {type(model).__name__}: sharding it as one unit "
            "(set EngineConfig.wrap_class_names to shard per layer)",
            stacklevel=3,
        )
    return found


def check_same_weights(model: nn.Module, backend) -> None:
    """Fail early if ranks built different weights (FSDP would silently train a mix of them). The checksums travel
    as int64 (every device reduces it) with their negations: the ranks agree when the maximum is minus the maximum of
    the negations. One rank has nothing to compare (bf16 wraps it: no collective then)."""
    import torch.distributed as dist

    if dist.get_world_size() == 1:
        return
    mine = weights_fingerprint(model.state_dict().items())
    extremes = torch.tensor([mine, -mine], dtype=torch.int64).to(backend.metrics_device())
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    if extremes[0].item() != -extremes[1].item():
        raise ValueError("ranks built different model weights: load the same checkpoint on every rank, or build "
                         "random weights inside the model factory (the engine seeds every rank alike first)")


UNWRAPPED = 0  # the "FSDP version" of a model that runs without a wrapper (one rank, nothing to shard)


def wrapper_version(config: EngineConfig, backend, world_size: int) -> int:
    """The FSDP version that wraps the model, or ``UNWRAPPED`` (see ``EngineConfig.wrap_single_rank``)."""
    if world_size == 1 and not config.wrap_single_rank and compute_dtype(config, backend) == torch.float32:
        return UNWRAPPED
    return config.fsdp_version


def shard_model(model: nn.Module, config: EngineConfig, backend, world_size: int,
                from_rank0: bool = False) -> tuple[nn.Module, int]:
    """Wrap ``model``; returns the wrapped module and the number of sharded units (layers + root).

    ``from_rank0``: the weights will be sent by rank 0 after sharding (``rank0_loading.py``); ranks other than 0 hold
    a meta-device model whose shards are allocated here, uninitialised. An unwrapped model (one rank) is only
    moved to the device and has no sharded units.
    """
    if wrapper_version(config, backend, world_size) == UNWRAPPED:
        return model.to(backend.device()), 0
    if not from_rank0:
        check_same_weights(model, backend)
    classes = layer_classes(model, config.wrap_class_names)
    dtype = compute_dtype(config, backend)
    if config.fsdp_version == 2:
        wrapped, units = _shard_fsdp2(model, classes, dtype, backend, world_size)
        if from_rank0 and any(p.is_meta for p in wrapped.parameters()):
            wrapped.to_empty(device=backend.device())  # this rank's shards only; FSDP2 keeps tied weights tied
        return wrapped, units
    return _shard_fsdp1(model, classes, dtype, backend, from_rank0)


def _shard_fsdp2(model, classes, dtype, backend, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(backend.device_type, (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else None
    kwargs = {"mesh": mesh, **({"mp_policy": policy} if policy else {})}
    units = 0
    for module in model.modules():
        if type(module) in classes:
            fully_shard(module, reshard_after_forward=True, **kwargs)
            units += 1
    # Explicit (torch's default for a root): the root's parameters stay gathered from forward into backward.
    # ``generation_context`` restores exactly these values after a gather-once ``generate``.
    fully_shard(model, reshard_after_forward=False, **kwargs)
    return model, units + 1


def _shard_fsdp1(model, classes, dtype, backend, from_rank0=False):
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    mixed = None
    if dtype != torch.float32:
        mixed = MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
    materialize = None
    if from_rank0 and any(p.is_meta for p in model.parameters()):
        materialize = fsdp1_materializer(backend.device())
    wrapped = FullyShardedDataParallel(
        model,
        param_init_fn=materialize,
        auto_wrap_policy=ModuleWrapPolicy(classes) if classes else None,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        mixed_precision=mixed,
        device_id=backend.fsdp_device_id(),
        use_orig_params=True,  # lets frozen (LoRA base) and trainable parameters share a unit
    )
    units = sum(1 for m in wrapped.modules() if isinstance(m, FullyShardedDataParallel))
    return wrapped, units


def unwrap(module: nn.Module, fsdp_version: int) -> nn.Module:
    """The model object the user gave (HF or PEFT), for methods such as ``generate``."""
    return module.module if fsdp_version == 1 else module


def generation_is_collective(fsdp_version: int, gather: str, world_size: int) -> bool:
    """Whether forwards inside ``generation_context`` are collectives, so every rank must make as many.

    With ``gather="once"`` every unit is gathered at the start of the call (FSDP2) or by the first forward, which
    every rank makes (FSDP1), and kept: later forwards communicate nothing and ranks may decode different numbers
    of tokens. With ``"per_layer"`` each forward gathers its layers: a rank that finished must keep stepping.
    """
    return fsdp_version != UNWRAPPED and world_size > 1 and gather == "per_layer"


def generation_context(module: nn.Module, fsdp_version: int, gather: str = "once"):
    """What HF ``generate`` needs around it: parameters gathered, each sharded unit once per call by default.

    ``gather="once"`` gathers every unit before generating and keeps it gathered for every new token, then
    reshards once at the end: one all-gather per unit per call instead of one per unit per token, for the memory
    of one unsharded copy of the model. ``gather="per_layer"`` gathers only the root's own parameters for the call
    (``generate`` may start a forward below the sharded root, as PEFT's does, which would skip the root's gather)
    and lets each decoder layer gather itself for every forward. An unwrapped model needs nothing.
    """
    if fsdp_version == UNWRAPPED:
        return contextlib.nullcontext()
    if fsdp_version == 2:
        return _fsdp2_gathered(module, everything=gather == "once")
    return _fsdp1_gathered(module, everything=gather == "once")


@contextlib.contextmanager
def _fsdp2_gathered(module: nn.Module, everything: bool):
    # FSDP2 initialises lazily on the root's first forward; a forward that starts below the root would make a
    # layer claim to be the root. Initialise from the root first (idempotent).
    private_state.lazy_init(module)
    units = private_state.fsdp2_units(module) if everything else [module]
    if everything:
        module.set_reshard_after_forward(False, recurse=True)  # layers keep their gathered parameters
    try:
        for unit in units:
            unit.unshard()
        with private_state.fsdp2_forward_hooks_detached(units) if everything else contextlib.nullcontext():
            yield
    finally:
        for unit in units:
            unit.reshard()
        if everything:  # back to how shard_model built it: layers reshard after forward, the root does not
            module.set_reshard_after_forward(True, recurse=True)
            module.set_reshard_after_forward(False, recurse=False)


@contextlib.contextmanager
def _fsdp1_gathered(module: nn.Module, everything: bool):
    from torch.distributed.fsdp import FullyShardedDataParallel

    # The root unit's own parameters, for the call (its forward may be skipped, see above).
    with FullyShardedDataParallel.summon_full_params(module, recurse=False, writeback=False):
        if not everything:
            yield
            return
        with private_state.fsdp1_units_kept_gathered(module):
            yield
