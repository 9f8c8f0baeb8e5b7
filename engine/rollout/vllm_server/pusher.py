"""The trainer's side of weight pushes into vLLM servers: one weight group per server, versioned pushes.

``connect`` opens, for every server, a weight group (``weight_wire``: the device backend's process group, gloo, NCCL,
HCCL or a plugin's) with the trainer's rank 0 as its rank 0 and the server's workers after it, through the server's
``/init_weight_transfer_engine`` (the worker checks there that it serves the trainer's model and has the trainer's
backend, then builds the same group). The group meets at a store bound to the trainer's ``address``, which admits only
workers that prove they hold the run's secret (``wire_store.py``). ``push`` pauses every server (``keep``: requests in
flight wait, then go on with the new weights; ``wait``: they finish on the old ones first), starts the update, streams
the weights one tensor at a time, each drawn just before it goes (the policy gathers one sharded unit at a time: never a
full copy per rank), closes it under the next version and resumes. Ranks other than 0 draw the weights too (drawing is a
collective) and send nothing. A push that fails half-way leaves the servers paused: they never sample from a part-old,
part-new model; the error says so.

With ``rollout.vllm.lora_sync=adapter`` a push may instead carry the LoRA adapter alone (``push(..., adapter=...)``):
the same pause, start, stream and finish, the workers writing it as a PEFT directory on the server's own disk (under
``adapter_root``, a path the trainer names: no shared filesystem), then ``/v1/load_lora_adapter`` under the
version's name, the version before the previous one unloaded, and resume.

With ``rollout.vllm.weight_sync=delta`` rank 0 keeps a copy of what the servers last received
(``weight_delta.SentCopy``) and sends, per tensor, only the elements whose bits changed (or the tensor whole where
that is smaller); each worker applies them to its own copy and loads the result. A push goes whole when the copy
cannot be trusted: the first one, and whenever a server reports another version than the last pushed (restarted,
or another trainer pushed). ``stats``: the last push's bytes on the wire and share of changed elements.

That is this package's ``accel`` engine, the same on every device. An engine that ships its own trainer side
(vLLM's ``nccl``, selected with ``rollout.vllm.weight_transfer``) goes through ``vllm_wire.VLLMTrainerWire``
instead: the same pause, versions and failure rule, the bytes moved by the engine's own trainer half.
"""

from __future__ import annotations

import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ..engines import lora_sync
from ..weight_delta import PushStats, SentCopy
from . import weight_wire, wire_store
from .client import ServerClient, ServerError
from .vllm_wire import VLLMTrainerWire


def _in_thread(work: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    """``work`` started in a thread; the list receives its exception, if any."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _joined(threads: list[tuple[threading.Thread, list[BaseException]]], timeout_s: float) -> None:
    """Wait for every thread; raise the first error (a thread still running after ``timeout_s`` is one)."""
    for thread, errors in threads:
        thread.join(timeout_s)
        if thread.is_alive():
            raise ServerError(f"a vLLM server did not answer within {timeout_s:g} s during a weight push")
        if errors:
            raise errors[0]


class WeightPusher:
    """Pushes from the trainer's rank 0 (``sender``) to ``clients``; ``workers[i]``: server i's worker count
    (its tensor-parallel size). ``address``: where the servers reach this process (its weight groups' stores)."""

    def __init__(self, clients: list[ServerClient], workers: list[int], address: str, signature: dict,
                 sender: bool, engine: str = "accel", settings: dict | None = None,
                 free_port: Callable[[], int] | None = None, pause_mode: str = "keep",
                 wire: VLLMTrainerWire | None = None, backend=None, lora_rank: int = 0, session: str = "",
                 weight_sync: str = "full") -> None:
        self.clients, self.workers, self.address = clients, workers, address
        self.signature, self.sender, self.engine = signature, sender, engine
        self.backend = backend  # the DeviceBackend whose weight group carries the weights (None: the selected one)
        self.lora_rank = lora_rank  # > 0: the servers must serve LoRA adapters of this rank (lora_sync=adapter)
        self.settings = dict(settings or {})  # the device's weight-group settings, sent with the init info
        self.timeout_s = float(self.settings.get("timeout_s", 600.0))
        self.free_port = free_port
        self.pause_mode = pause_mode  # keep: requests in flight resume on the new weights; wait: they finish first
        self.wire = wire  # an engine with its own trainer side (vLLM's nccl...); None: this package's own wire
        self.groups: list = []
        self.version = 0  # the version the servers report once a push finished; 0: none yet
        self.pause_s = 0.0  # how long the last push waited for the servers to pause
        self.adapter: str | None = None  # the LoRA adapter the servers sample with (lora_sync=adapter), every rank
        self.loaded: list[str] = []  # the adapter names the servers hold, oldest first
        self.session = session or secrets.token_hex(4)  # in this run's adapters' names and their directory
        self.secret = wire_store.new_secret()  # what a worker proves at the weight group's store
        self.adapter_root = str(Path(tempfile.gettempdir()) / f"accel-vllm-adapters-{self.session}")
        self.weight_sync = weight_sync  # full, or delta: only changed elements after the first push
        self.sent = SentCopy() if weight_sync == "delta" and sender else None  # what the servers last received
        self.stats: PushStats | None = None  # the last push's figures (weight_sync=delta), on every rank

    def _port(self) -> int:
        from accel_backends.spawn import free_port

        return (self.free_port or free_port)()

    def connect(self) -> None:
        """Open one weight group per server; a server lacking the engine (or, with this package's wire, serving
        another model or lacking the trainer's backend) is named here, before any training."""
        if self.wire is not None:  # every rank builds its engines (rank 0's open the groups)
            try:
                self.wire.connect(self.clients, self.workers, self.address, self._port)
            except ServerError as exc:  # a server's refusal gets what to do; the trainer's own lack is said as is
                raise ServerError(self._refusal(exc) if str(exc).startswith("vLLM server ") else str(exc)) from None
            return
        if not self.sender:
            return
        if self.backend is None:
            from accel_backends import get_backend

            self.backend = get_backend()
        for client, workers in zip(self.clients, self.workers, strict=True):
            size = 1 + workers
            info = {**self.settings, "master_address": self.address, "rank_offset": 1, "world_size": size,
                    "model_signature": self.signature, "device_backend": self.backend.name,
                    "lora_rank": self.lora_rank}
            if self.weight_sync != "full":  # named only when asked for: a full push needs nothing new of a server
                info["weight_sync"] = self.weight_sync
            try:  # first the check alone: a refusal must not leave this side waiting for the group
                client.init_weight_transfer_engine({**info, "master_port": 0, "check_only": True})
            except ServerError as exc:
                raise ServerError(self._refusal(exc)) from None
            store = wire_store.host_store(self.address, size, self.timeout_s)
            info.update(master_port=store.port, secret=self.secret)
            joining = _in_thread(lambda c=client, i=info: c.init_weight_transfer_engine(i))
            opened: list = []
            opening = _in_thread(lambda s=store, n=size, box=opened: box.append(weight_wire.open_group(
                self.backend, self.address, s.port, 0, n, self.timeout_s, self.secret, store=s)))
            self._wait_for_both(joining, opening)
            self.groups.append(opened[0])

    def _wait_for_both(self, joining, opening) -> None:
        """The server's join and this side's opening of one group, the first failure of either raised at once (a
        refused peer, or a server that fails to join after its check passed, leaves nobody waiting the timeout)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            if joining[1]:
                raise ServerError(self._refusal(joining[1][0]))
            if opening[1]:
                error = opening[1][0]
                raise ServerError(str(error)) if isinstance(error, wire_store.RefusedPeer) else error
            if not (joining[0].is_alive() or opening[0].is_alive()):
                return
            if time.monotonic() > deadline:
                raise ServerError(f"a vLLM server did not join the trainer's weight group within {self.timeout_s:g} s")
            (joining if joining[0].is_alive() else opening)[0].join(0.05)

    def _refusal(self, exc: BaseException) -> str:
        """The server's refusal of the handshake, with what to do unless it says so itself (another model)."""
        text = str(exc)
        if any(own in text for own in ("runs another model", "cannot build the trainer's weight group",
                                       "LoRA adapters")):
            return text
        return (f"{text}: the server needs the {self.engine!r} weight-transfer engine: start it with "
                f"--weight-transfer-config '{{\"backend\": \"{self.engine}\"}}' and VLLM_SERVER_DEV_MODE=1, from a "
                "Python where this package is installed (it registers the engine through vllm.general_plugins)")

    def push(self, weights: Iterable[tuple[str, torch.Tensor]], adapter: dict | None = None) -> float:
        """Send every ``(name, tensor)`` of ``weights`` to every server under the next version; returns the
        version's number. Every rank calls it and consumes ``weights``. ``adapter``: the weights are a LoRA
        adapter's and this is its ``adapter_config.json``; the servers load it as the version's adapter."""
        version = self.version + 1
        if self.wire is not None:
            return self._push_through_wire(version, weights)
        if not self.sender:
            for _ in weights:
                pass
            if self.weight_sync == "delta" and adapter is None:
                self.stats = PushStats()  # this rank sent nothing
            self.version = version
            self.adapter = lora_sync.adapter_name(version, self.session) if adapter is not None else None
            return version
        info = {"version": str(version)}
        if adapter is not None:
            info.update(kind="adapter", adapter_config=adapter,
                        directory=str(lora_sync.version_directory(self.adapter_root, version)))
        self._pause()
        messages = self._delta_source() if self.sent is not None and adapter is None else None
        for client in self.clients:
            client.start_weight_update()
        receiving = [_in_thread(lambda c=c: c.update_weights(info)) for c in self.clients]
        try:
            for name, tensor in weights:
                weight_wire.send(self.groups, name, messages(name, tensor) if messages else tensor)
            weight_wire.send_end(self.groups)
            _joined(receiving, self.timeout_s)
        except Exception as exc:
            if self.sent is not None:
                self.sent.drop()
            cause = f"{type(exc).__name__}: {exc}"
            dead = [client.url for client in self.clients if not client.healthy()]
            if dead:  # the usual cause: a server ended mid-push; name it as a sampling request would
                raise ServerError(f"vLLM server {dead[0]} is unreachable: it ended during a weight push ({cause}); "
                                  "restart it (and the run from its last checkpoint)") from None
            raise ServerError(f"a weight push to the vLLM servers failed half-way ({cause}); they stay paused with "
                              "part of the new weights and must be restarted") from None
        for client in self.clients:
            client.finish_weight_update(str(version))
        if adapter is not None:
            self._swap_adapters(version, info["directory"])
        else:
            self.adapter, self.loaded = None, []  # new base weights: the servers dropped their adapters
        for client in self.clients:
            client.resume()
        self.version = version
        if messages:
            self.stats = self.sent.stats
        return version

    def _delta_source(self):
        """``message(name, tensor)`` for this push: deltas against the servers' copy, whole after the copy was
        dropped (the first push; a server reporting another version than the last pushed: restarted, or another
        trainer pushed). A push that fails half-way drops it too (the servers hold part of it)."""
        if self.version == 0 or any(client.weight_version() != str(self.version) for client in self.clients):
            self.sent.drop()
        self.sent.start()
        return self.sent.message

    def _swap_adapters(self, version: int, directory: str) -> None:
        """Load the version's adapter on every server; unload the ones before the previous (a request sent just
        before the push still names the previous one). A server refusing is named, the servers left paused."""
        name = lora_sync.adapter_name(version, self.session)
        for client in self.clients:
            client.load_lora_adapter(name, directory)
        self.loaded.append(name)
        while len(self.loaded) > lora_sync.LORA_SLOTS:
            old = self.loaded.pop(0)
            for client in self.clients:
                client.unload_lora_adapter(old)
        self.adapter = name

    def unload_adapters(self) -> None:
        """Unload this run's adapters from every server that still answers (the run ends; best effort)."""
        for name in self.loaded:
            for client in self.clients:
                try:
                    client.unload_lora_adapter(name)
                except ServerError:
                    pass
        self.loaded = []

    def _pause(self) -> None:
        """Pause every server in ``pause_mode``; ``pause_s``: how long that took (mode wait: the requests in flight
        finishing)."""
        paused = time.perf_counter()
        for client in self.clients:
            client.pause(self.pause_mode)
        self.pause_s = time.perf_counter() - paused

    def _push_through_wire(self, version: int, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """The push through an engine's own trainer side: it drives start / update / finish; rank 0 pauses the
        servers before and resumes them after (a failure leaves them paused, as this package's wire does)."""
        if self.sender:
            self._pause()
        try:
            self.wire.send(version, weights)
        except ServerError:
            raise
        except Exception as exc:
            raise ServerError(f"a weight push to the vLLM servers through the {self.engine!r} engine failed half-way "
                              f"({type(exc).__name__}: {exc}); they stay paused with part of the new weights and "
                              "must be restarted") from None
        if self.sender:
            for client in self.clients:
                client.resume()
        self.version = version
        return version

    def check_version(self) -> None:
        """Every server reports the last pushed version (a sample never comes from a half-updated model)."""
        for client in self.clients:
            reported = client.weight_version()
            if self.version and reported != str(self.version):
                raise ServerError(f"vLLM server {client.url} reports weight version {reported!r}, the trainer pushed "
                                  f"{self.version}: another trainer or a restart changed its weights")
