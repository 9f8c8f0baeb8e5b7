"""Weights into vLLM servers through a weight-transfer engine that ships its own trainer side: vLLM's ``nccl``, or
a third party's, found by name in vLLM's ``WeightTransferTrainerFactory`` (``rollout.vllm.weight_transfer``).

The engine's trainer half opens the weight group and moves the bytes (its device streams and communicators are its
own business, so nothing device-specific is written here). This module hands it what it asks for: a client of the
server's RL routes that closes each push under the trainer's version (``VersionedClient``), and a source of the
policy's weights whose names, dtypes and shapes are declared before any byte moves (``PolicySource``).

Three costs, said plainly: vLLM's engines declare every parameter up front in the order they are sent, so the first
connection draws the policy's weights once to learn that order (one gather, one sharded unit at a time); each
engine takes one source, so a push draws the weights once per server (the draws are collectives: every rank makes
them, rank 0 alone sends); and an engine that declares a ``packed`` setting gets ``packed=False`` unless the
device's settings say otherwise: vLLM's packed producer draws the source on rotating side streams of its own with
no wait on the stream that produced the policy's weights (the FSDP gathers, after the optimizer's step), while the
unpacked path broadcasts on the caller's stream. This package's own wire (``weight_wire.py``) never leaves it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from .client import ServerClient, ServerError

WeightDraw = Callable[[], Iterable[tuple[str, torch.Tensor]]]  # a fresh pass over the policy's full weights


class VersionedClient:
    """vLLM's ``VLLMWeightSyncClient`` over one server: the engine drives start / update / finish itself, and the
    finish names the version this push gives the weights (``version``, set by the pusher before each push)."""

    def __init__(self, client: ServerClient) -> None:
        self.client = client
        self.version: str | None = None

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.client.init_weight_transfer_engine(init_info)

    def start_weight_update(self) -> None:
        self.client.start_weight_update()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.client.update_weights(update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.client.finish_weight_update(self.version or weight_version)


class PolicySource:
    """vLLM's ``WeightSource`` over the policy: ``metadata()`` from the order learnt at connection, each pass
    the one the pusher sets in ``next_pass`` (consumed once)."""

    def __init__(self, metadata: list) -> None:
        self._metadata = metadata
        self.next_pass: Iterable[tuple[str, torch.Tensor]] | None = None

    def metadata(self) -> list:
        return self._metadata

    def held_names(self) -> None:
        return None  # every rank draws every parameter (FSDP gathers it)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.next_pass is None:
            raise ServerError("a weight-transfer engine drew the policy's weights twice in one push")
        weights, self.next_pass = self.next_pass, None
        yield from weights


class VLLMTrainerFactory:
    """vLLM's trainer-side registry, imported when first used (a test hands in a stand-in with the same methods)."""

    def _registry(self):
        try:
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
            from vllm.plugins import load_general_plugins
        except ImportError as exc:
            raise ServerError(f"pushing into vLLM servers through their device's weight-transfer engine needs vLLM in "
                              f"the trainer's Python too ({exc}): install the vLLM build for this device") from None
        load_general_plugins()  # a platform package (vllm-ascend) registers its engines' trainer sides here
        return WeightTransferTrainerFactory

    def init_info_class(self, engine: str) -> type:
        registry = self._registry()
        loaders = getattr(registry, "_registry", {})
        if engine not in loaders:
            raise ServerError(f"vLLM has no trainer side for the weight-transfer engine {engine!r} (known: "
                              f"{', '.join(sorted(loaders)) or 'none'}): install the vLLM platform package that "
                              "provides it, or use rollout.vllm.mode=colocate")
        return loaders[engine]().init_info_cls

    def param_meta(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]):
        from vllm.distributed.weight_transfer.base import ParamMeta

        return ParamMeta(name, dtype, shape)

    def trainer_init(self, init_info, client: VersionedClient, source: PolicySource):
        return self._registry().trainer_init(init_info, client=client, source=source)


SAME_STREAM_SETTINGS = {"packed": False}  # see the module's docstring: the packed producer's side streams


def init_info(info_class: type, settings: dict[str, Any], **fields: Any):
    """``info_class`` built from the group's ``fields`` and those of ``SAME_STREAM_SETTINGS`` and the device's
    ``settings`` (which win) it declares (the others, such as this package's engine's timeout, are not its own)."""
    declared = {field.name for field in dataclasses.fields(info_class)}
    chosen = {**SAME_STREAM_SETTINGS, **settings}
    return info_class(**{**{k: v for k, v in chosen.items() if k in declared}, **fields})


class VLLMTrainerWire:
    """One trainer engine of ``engine`` per server, on every trainer rank (rank 0 sends)."""

    def __init__(self, engine: str, settings: dict[str, Any], rank: int, draw: WeightDraw,
                 factory: VLLMTrainerFactory | None = None) -> None:
        self.engine, self.settings, self.rank, self.draw = engine, settings, rank, draw
        self.factory = factory or VLLMTrainerFactory()
        self.engines: list = []

    def connect(self, clients: list[ServerClient], workers: list[int], address: str,
                free_port: Callable[[], int]) -> None:
        info_class = self.factory.init_info_class(self.engine)
        metadata = [self.factory.param_meta(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in self.draw()]
        for client, count in zip(clients, workers, strict=True):
            port = free_port() if self.rank == 0 else 0  # only the sender opens the group's endpoint
            info = init_info(info_class, self.settings, master_address=address, master_port=port,
                             world_size=1 + count, rank=self.rank)
            self.engines.append(self.factory.trainer_init(info, VersionedClient(client), PolicySource(metadata)))

    def send(self, version: int, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Every server's engine sends one pass under ``version``: ``weights`` for the first, fresh draws after."""
        for index, engine in enumerate(self.engines):
            engine.client.version = str(version)
            engine.source.next_pass = weights if index == 0 else self.draw()
            engine.send_weights()

    def close(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        self.engines = []
