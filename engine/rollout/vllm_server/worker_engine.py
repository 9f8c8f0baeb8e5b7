"""The ``accel`` weight-transfer engine, inside vLLM's server workers (registered by ``plugin.py``) on every device.

vLLM calls it through its RL routes. ``init_weight_transfer_engine`` comes twice: first to check that the server
runs the trainer's model and has the trainer's device backend (``check_only``: a refusal leaves nobody waiting for
a group), then to join the trainer's weight group, built by that backend (``DeviceBackend.new_weight_group``: gloo,
NCCL, HCCL or a plugin's) with this worker at rank ``rank_offset`` + its rank inside the server;
``start_weight_update`` / ``finish_weight_update`` wrap the load in vLLM's layerwise reload (its CPU backend repacks
linear weights at start-up and empties ``.weight``, so a plain ``load_weights`` would write into nothing);
``update_weights`` receives one push (``weight_wire.receive``, on the worker's current stream) into the model. This
module imports vLLM: it is loaded only inside a vLLM process.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from . import weight_wire
from .model_signature import signature_differences, signature_of


@dataclasses.dataclass
class AccelInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    device_backend: str = "cpu"  # the trainer's backend: it builds this side's group too
    timeout_s: float = 600.0
    model_signature: dict[str, Any] = dataclasses.field(default_factory=dict)
    check_only: bool = False  # the handshake's first call: check the model and the backend, join nothing


@dataclasses.dataclass
class AccelUpdateInfo(WeightTransferUpdateInfo):
    version: str | None = None


class AccelWeightTransferEngine(WeightTransferEngine[AccelInitInfo, AccelUpdateInfo]):
    init_info_cls = AccelInitInfo
    update_info_cls = AccelUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None

    def init_transfer_engine(self, init_info: AccelInitInfo) -> None:
        differences = signature_differences(signature_of(self.model_config.hf_config), init_info.model_signature)
        if differences:
            raise ValueError("this server runs another model than the trainer's (" + "; ".join(differences) + ")")
        backend = weight_wire.backend_named(init_info.device_backend)
        if init_info.check_only:
            return
        rank = init_info.rank_offset + self.parallel_config.rank
        self.group = weight_wire.open_group(backend, init_info.master_address, init_info.master_port, rank,
                                            init_info.world_size, init_info.timeout_s)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class synchronizes torch.accelerator after receiving, which a CPU-only torch has not; here every
        # tensor is received and loaded on the worker's current stream, each broadcast waited on.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: AccelUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("the accel weight transfer was not initialised: call init_weight_transfer_engine first")
        for name, tensor in weight_wire.receive(self.group):
            self.model.load_weights([(name, tensor.to(self.device))])

    def shutdown(self) -> None:
        self.group = None
