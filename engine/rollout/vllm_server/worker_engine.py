"""The ``accel`` weight-transfer engine, inside vLLM's server workers (registered by ``plugin.py``) on every device.

vLLM calls it through its RL routes. ``init_weight_transfer_engine`` comes twice: first to check that the server
runs the trainer's model and has the trainer's device backend (``check_only``: a refusal leaves nobody waiting for
a group), then to join the trainer's weight group, built by that backend (``DeviceBackend.new_weight_group``: gloo,
NCCL, HCCL or a plugin's) with this worker at rank ``rank_offset`` + its rank inside the server;
``start_weight_update`` / ``finish_weight_update`` wrap the load in vLLM's layerwise reload (its CPU backend repacks
linear weights at start-up and empties ``.weight``, so a plain ``load_weights`` would write into nothing);
``update_weights`` receives one push (``weight_wire.receive``, on the worker's current stream) into the model. With
``rollout.vllm.weight_sync=delta`` the worker keeps a copy of every weight it received (``weight_delta.ReceivedCopy``,
on its device), applies each delta there and loads the whole updated tensor (vLLM's loader takes checkpoint-format
tensors; its own parameters may be merged or repacked). This
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

from ..weight_delta import Delta, ReceivedCopy
from . import weight_wire
from .model_signature import signature_differences, signature_of


@dataclasses.dataclass
class AccelInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    device_backend: str = "cpu"  # the trainer's backend: it builds this side's group too
    lora_rank: int = 0  # > 0: the trainer pushes LoRA adapters of this rank (rollout.vllm.lora_sync=adapter)
    timeout_s: float = 600.0
    model_signature: dict[str, Any] = dataclasses.field(default_factory=dict)
    check_only: bool = False  # the handshake's first call: check the model and the backend, join nothing
    secret: str = ""  # the run's weight-group secret: this worker proves it to the trainer's store (wire_store.py)
    weight_sync: str = "full"  # delta: keep a copy of the weights received, pushes may carry only what changed


@dataclasses.dataclass
class AccelUpdateInfo(WeightTransferUpdateInfo):
    version: str | None = None
    kind: str = "weights"  # or "adapter": a LoRA adapter, written to ``directory`` for /v1/load_lora_adapter
    directory: str | None = None
    adapter_config: dict[str, Any] | None = None


class AccelWeightTransferEngine(WeightTransferEngine[AccelInitInfo, AccelUpdateInfo]):
    init_info_cls = AccelInitInfo
    update_info_cls = AccelUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None
        self.reloading = False  # inside a push of base weights: vLLM's layerwise reload is open
        self.received: ReceivedCopy | None = None  # weight_sync=delta: the weights as last received

    def init_transfer_engine(self, init_info: AccelInitInfo) -> None:
        differences = signature_differences(signature_of(self.model_config.hf_config), init_info.model_signature)
        if differences:
            raise ValueError("this server runs another model than the trainer's (" + "; ".join(differences) + ")")
        lora = self.vllm_config.lora_config
        if init_info.lora_rank and (lora is None or lora.max_lora_rank < init_info.lora_rank):
            raise ValueError(f"this server serves no LoRA adapters of rank {init_info.lora_rank} (the trainer pushes "
                             f"them: rollout.vllm.lora_sync=adapter): start it with --enable-lora --max-lora-rank "
                             f"{init_info.lora_rank} or more --max-loras 2 and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1")
        backend = weight_wire.backend_named(init_info.device_backend)
        if init_info.check_only:
            return
        rank = init_info.rank_offset + self.parallel_config.rank
        if not init_info.secret:
            raise ValueError("the trainer sent no weight-group secret: this server's accel engine is newer than the "
                             "trainer's package; install the same version on both sides")
        self.received = ReceivedCopy() if init_info.weight_sync == "delta" else None
        self.group = weight_wire.open_group(backend, init_info.master_address, init_info.master_port, rank,
                                            init_info.world_size, init_info.timeout_s, init_info.secret)

    def start_weight_update(self) -> None:
        """Nothing yet: a push of base weights opens vLLM's layerwise reload with its first tensor (an adapter's
        push leaves the model alone)."""
        self.reloading = False

    def finish_weight_update(self) -> None:
        if self.reloading:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)
            self.reloading = False

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class synchronizes torch.accelerator after receiving, which a CPU-only torch has not; here every
        # tensor is received and loaded on the worker's current stream, each broadcast waited on.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: AccelUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("the accel weight transfer was not initialised: call init_weight_transfer_engine first")
        if update_info.kind == "adapter":
            self._receive_adapter(update_info)
            return
        if not self.reloading:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)
            self.reloading = True
        for name, message in weight_wire.receive(self.group):
            if self.received is not None:  # the loader gets its own buffer: the copy changes in the next push
                message = self.received.take(name, message).clone()
            elif isinstance(message, Delta):
                raise ValueError(f"received a delta for weight {name!r}, and this server was joined with "
                                 "weight_sync=full: reconnect the trainer")
            self.model.load_weights([(name, message.to(self.device))])

    def _receive_adapter(self, update_info: AccelUpdateInfo) -> None:
        """The adapter's tensors, written by the server's first worker as a PEFT directory (the other workers of a
        tensor-parallel server take part in the broadcasts and keep nothing); versions before the previous one are
        removed from the disk."""
        from pathlib import Path

        from engine.rollout.engines import lora_sync

        tensors = dict(weight_wire.receive(self.group))
        if self.parallel_config.rank == 0:
            directory = Path(update_info.directory)
            lora_sync.write_adapter(directory, tensors, update_info.adapter_config or {})
            version = int(directory.name.removeprefix("v"))
            lora_sync.prune(directory.parent, keep_from=version - lora_sync.LORA_SLOTS + 1)

    def shutdown(self) -> None:
        self.group = None
