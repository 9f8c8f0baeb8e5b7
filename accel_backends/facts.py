"""What a backend declares about its device for the layers above it: facts an inference engine colocated with
training needs, the weight group a trainer pushes weights through, and what sequence parallelism needs. Plain frozen
dataclasses, so that the engine reads them and never asks for a device by name (re-exported by ``base`` and
``accel_backends``: the public names stay where they were)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class InferenceEngineFacts:
    """What an inference engine colocated with training (vLLM and its device builds) must know about a device.

    ``package``: what to install for it here (named when it is missing). ``sleep_level``: the engine's sleep mode
    to use while the trainer updates (0: the device has none; the engine keeps its memory). ``weight_reload``: how
    weights are replaced in place after an update: ``"reload_weights"`` (the worker's own method, given the
    weights as an iterator) or ``"load_weights"`` (the model's ``load_weights``, called on the worker).
    ``memory_fraction``: whether the engine's memory is sized by a share of the device (``gpu_memory_utilization``);
    ``kv_cache_env``: else, the environment variable that sizes its KV cache, in GiB. ``env``: variables the
    engine's build needs on this device, set before it starts unless the user set them. ``engine_args``: engine
    arguments this device needs (the user's own arguments still win). ``min_head_size``: the smallest attention
    head size the engine's kernels take on this device (0: no known limit).

    For vLLM servers (``rollout.vllm.mode=server``): ``weight_transfer``, the weight-transfer engine that carries
    the trainer's weights into the servers (the name given to a server's ``--weight-transfer-config``). The default,
    ``accel``, is this package's own engine on every device: its process group is the backend's
    (``DeviceBackend.new_weight_group``), its receiving half registered inside vLLM by this package. Another name
    (vLLM's ``nccl``, a third party's) is an engine whose trainer half comes from vLLM's
    ``WeightTransferTrainerFactory`` under that name. ``weight_transfer_settings``: the weight group's settings sent
    with the engine's init info (e.g. its timeout; an engine with its own trainer half takes those its init info
    declares).
    """

    package: str = "vllm"
    sleep_level: int = 0
    weight_reload: str = "reload_weights"
    memory_fraction: bool = True
    kv_cache_env: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    engine_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    min_head_size: int = 0
    weight_transfer: str = "accel"
    weight_transfer_settings: dict[str, Any] = dataclasses.field(default_factory=lambda: {"timeout_s": 600.0})


@dataclasses.dataclass(frozen=True)
class WeightGroup:
    """A process group that carries a trainer's weights to inference servers (``DeviceBackend.new_weight_group``):
    ``group``, a torch process-group backend (``broadcast(tensors, options)`` returning a work to wait on), and
    ``device``, where the tensors it moves must live (the host for gloo, the device for the device's library)."""

    group: Any
    device: torch.device


@dataclasses.dataclass(frozen=True)
class SequenceParallelFacts:
    """What sequence parallelism (the Ulysses exchange: an all-to-all before and after each attention) must know
    about a device.

    ``unsupported``: ``None``, or why the device cannot run it (its collective library has no all-to-all, it lacks
    the ``scaled_dot_product_attention`` run between the exchanges...), said when a user asks for it.
    ``head_multiple``: the attention heads each rank attends after the exchange must be a multiple of this (1: any
    count; a kernel that wants whole head blocks says so here).
    """

    unsupported: str | None = None
    head_multiple: int = 1
