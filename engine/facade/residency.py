"""Where an engine's parameters and optimizer state live (device or host), and the measured moves between them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import accel_backends

from .. import events
from ..config import EngineConfig
from ..fsdp import offload
from ..fsdp.offload import DEVICE, HOST


class Residency:
    """The place of each part (``"params"``, ``"optimizer"``) of one engine, changed only by ``move``.

    Every move is reported to the engine's observers (``events.transfer``) with its bytes and measured time. The
    engine is passed to each move, not kept: a part of the engine holds no reference back to it.
    """

    def __init__(self, config: EngineConfig, backend: accel_backends.DeviceBackend) -> None:
        self._config = config
        self._backend = backend
        self._where = {"params": DEVICE, "optimizer": DEVICE}

    def __getitem__(self, part: str) -> str:
        return self._where[part]

    def as_dict(self) -> dict[str, str]:
        return dict(self._where)

    def offloaded(self, parts: Sequence[str]) -> list[str]:
        """Those of ``parts`` the config offloads and that are in host memory now (what a mode brings in)."""
        config = self._config
        configured = {"params": config.param_offload, "optimizer": config.optimizer_offload}
        return [p for p in parts if configured[p] and self._where[p] == HOST]

    def require_on_device(self, what: str, parts: Sequence[str]) -> None:
        away = [p for p in parts if self._where[p] != DEVICE]
        if away:
            raise RuntimeError(f"{what} needs {' and '.join(away)} on the device, but they are offloaded: call it "
                               "inside engine.train_mode() (or eval_mode() for forward-only work)")

    def move(self, engine: Any, device: str, model: bool, optimizer: bool, grad: bool) -> None:
        """What ``FSDPEngine.to`` does for ``engine``: move the parts not already at ``device``, gradients with
        their parameters."""
        if device not in (DEVICE, HOST):
            raise ValueError(f"device must be {DEVICE!r} or {HOST!r}, got {device!r}")
        version = engine.fsdp_version
        if model and self._where["params"] != device:
            param_bytes, grad_bytes = offload.model_bytes(engine.module, version)
            if grad_bytes and not grad:
                raise ValueError("gradients exist and must move with their parameters: pass grad=True, or call "
                                 "optimizer_step() first")
            seconds = self._timed(offload.move_model, engine.module, version, self._backend, device)
            self._where["params"] = device
            events.transfer(engine, "params", device, param_bytes, seconds=seconds)
            if grad_bytes:  # they travelled with the parameters, in the same measured time
                events.transfer(engine, "grads", device, grad_bytes, seconds=seconds)
        if optimizer and engine.optimizer is not None and self._where["optimizer"] != device:
            num_bytes = offload.optimizer_bytes(engine.optimizer)
            seconds = self._timed(offload.move_optimizer, engine.optimizer, self._backend, device)
            self._where["optimizer"] = device
            events.transfer(engine, "optimizer", device, num_bytes, seconds=seconds)

    def _timed(self, move: Callable[..., None], *args: Any) -> float:
        """Run one move: its copies are non-blocking where the backend pins host memory, and have landed when it
        returns (each move synchronises once, ``fsdp/offload.py``), so the time is the move's."""
        start = time.perf_counter()
        move(*args)
        return time.perf_counter() - start
