"""This package's weight wire on every device (issue 35 item 4), against its contract with clearly labelled
RECORDING STAND-INS: no GPU, no NPU and no vLLM here (the real path runs with gloo in the vLLM leg and in
test_vllm_server.py's two processes).

The weight group is the backend's (``DeviceBackend.new_weight_group``): NCCL on cuda (a stand-in
``ProcessGroupNCCL`` records how it was built; npu's HCCL is in test_npu_backend_contract.py), gloo by default, and a
third party's own group when its backend declares one: the trainer builds it and names its backend to the server,
whose worker builds the same through that name. The wire reads every tensor on the caller's stream: each is drawn,
broadcast and waited on before the next is drawn (the gathered unit it came from may be freed then), and what one
side broadcasts the other receives."""

from __future__ import annotations

import datetime

import pytest
import torch

import accel_backends
from accel_backends import WeightGroup
from accel_backends.backends.cpu import CPUBackend
from accel_backends.backends.cuda import CUDABackend
from accel_backends.spawn import free_port
from engine.rollout.vllm_server import weight_wire, wire_store
from engine.rollout.vllm_server.client import ServerClient, ServerError
from engine.rollout.vllm_server.pusher import WeightPusher

WEIGHTS = {"model.embed_tokens.weight": torch.arange(12.0).reshape(4, 3), "lm_head.weight": torch.ones(4, 3),
           "model.norm.weight": torch.full((3,), 2.0, dtype=torch.bfloat16), "step": torch.tensor(7)}


class RecordingWork:
    def __init__(self, log: list) -> None:
        self.log = log

    def wait(self) -> bool:
        self.log.append(("wait",))
        return True


class RecordingGroup:
    """Stand-in for a device library's process group (NOT a real one): records each broadcast (a copy of the
    bytes, its dtype and device) and each wait, in the log it shares with the draws."""

    def __init__(self, log: list) -> None:
        self.log, self.sent = log, []

    def broadcast(self, tensors, options):
        (tensor,) = tensors
        assert options.rootRank == 0
        self.log.append(("broadcast", tensor.dtype, tensor.numel()))
        self.sent.append(tensor.clone())
        return RecordingWork(self.log)


class ReplayGroup:
    """The receiving side of a ``RecordingGroup``: fills each broadcast's buffer with what rank 0 sent, in order."""

    def __init__(self, sent: list) -> None:
        self.sent = list(sent)

    def broadcast(self, tensors, options):
        (tensor,) = tensors
        tensor.copy_(self.sent.pop(0))
        return RecordingWork([])


class RecordingDeviceBackend(CPUBackend):
    """A third party's device (a stand-in): it declares its weight group and nothing else."""

    name = "recording-device"

    def __init__(self) -> None:
        super().__init__()
        self.log: list = []
        self.built: list = []

    def new_weight_group(self, store, rank, world_size, timeout_s):
        self.built.append((type(store).__name__, rank, world_size, timeout_s))
        group = RecordingGroup(self.log)
        return WeightGroup(group, torch.device("cpu"))


class RecordingClient(ServerClient):
    """A server's RL routes, recorded instead of called over HTTP; its workers join the trainer's store with the
    secret the join names, as the server's engine does."""

    def __init__(self, url: str, log: list) -> None:
        super().__init__(url)
        self.log = log

    def call(self, method, path, body=None, query=None, timeout_s=None):
        self.log.append((path, body))
        info = (body or {}).get("init_info", {})
        if path == "/init_weight_transfer_engine" and not info.get("check_only"):
            for rank in range(1, info["world_size"]):
                wire_store.join(info["master_address"], info["master_port"], rank, info["secret"], 10)
        return {"status": "ok"}

    def healthy(self) -> bool:
        return True


def _draws(log: list):
    for name, tensor in WEIGHTS.items():
        log.append(("draw", name))
        yield name, tensor


def test_a_backends_own_group_carries_the_push_each_tensor_waited_on_before_the_next_is_drawn():
    backend, routes = RecordingDeviceBackend(), []
    pusher = WeightPusher([RecordingClient("http://srv0:8000", routes)], [2], "127.0.0.1", {"hidden_size": 3},
                          sender=True, settings={"timeout_s": 30.0}, free_port=free_port, backend=backend)
    pusher.connect()
    assert backend.built == [("PrefixStore", 0, 3, 30.0)]  # the trainer's rank 0 and the server's 2 workers
    (check, join) = [body["init_info"] for path, body in routes if path == "/init_weight_transfer_engine"]
    assert check["check_only"] and not join.get("check_only")
    assert join["device_backend"] == "recording-device"  # the server's worker builds the same group by this name
    assert (join["rank_offset"], join["world_size"], join["timeout_s"]) == (1, 3, 30.0)

    assert pusher.push(_draws(backend.log)) == 1
    log = backend.log
    draws = [i for i, entry in enumerate(log) if entry[0] == "draw"]
    assert len(draws) == len(WEIGHTS)
    for index, start in enumerate(draws):
        end = draws[index + 1] if index + 1 < len(draws) else len(log)
        steps = [entry[0] for entry in log[start + 1:end]]
        # header, name, bytes: each broadcast waited on before anything else, and all before the next draw
        assert steps[:6] == ["broadcast", "wait"] * 3, (index, steps)
    assert log[-2:] == [("broadcast", torch.int64, weight_wire.HEADER), ("wait",)]  # the END header
    payloads = [entry for entry in log if entry[0] == "broadcast" and entry[1] == torch.uint8]
    assert sum(entry[2] for entry in payloads[1::2]) == sum(t.numel() * t.element_size() for t in WEIGHTS.values())

    (group,) = pusher.groups
    received = list(weight_wire.receive(WeightGroup(ReplayGroup(group.group.sent), torch.device("cpu"))))
    assert [name for name, _ in received] == list(WEIGHTS)
    for (_, got), want in zip(received, WEIGHTS.values(), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_the_server_builds_its_half_through_the_backend_the_trainer_names():
    backend = RecordingDeviceBackend()

    class Plugin:
        @accel_backends.hookimpl
        def register_backends(self, register):
            register(backend)

    plugin = Plugin()
    accel_backends.register_plugin(plugin)
    try:
        assert weight_wire.backend_named("recording-device") is backend
        host = wire_store.host_store("127.0.0.1", 2, 10)
        joined = weight_wire.open_group(weight_wire.backend_named("recording-device"), "127.0.0.1", host.port, 1, 2,
                                        10, "the run's secret")
        assert isinstance(joined.group, RecordingGroup) and backend.built == [("PrefixStore", 1, 2, 10)]
        del host
    finally:
        accel_backends.unregister_plugin(plugin)
    with pytest.raises(ValueError) as missing:
        weight_wire.backend_named("recording-device")  # a server without the trainer's backend installed
    assert str(missing.value).startswith("this server cannot build the trainer's weight group: ")
    assert "recording-device" in str(missing.value) and "\n" not in str(missing.value)


class RecordingNCCL:
    """Stand-in for ``torch.distributed.ProcessGroupNCCL`` (NOT NCCL): records how it was built."""

    built: list = []

    class Options:
        def __init__(self) -> None:
            self._timeout = None

    def __init__(self, store, rank, size, options) -> None:
        RecordingNCCL.built.append((store, rank, size, options._timeout))


def test_cuda_builds_an_nccl_weight_group_on_its_gpu(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "ProcessGroupNCCL", RecordingNCCL, raising=False)  # a CPU build of torch has none
    monkeypatch.setattr(CUDABackend, "current_index", lambda self: 3)
    RecordingNCCL.built = []
    store = dist.HashStore()
    made = CUDABackend().new_weight_group(store, 0, 5, 42.0)
    assert isinstance(made.group, RecordingNCCL) and made.device == torch.device("cuda", 3)
    assert RecordingNCCL.built == [(store, 0, 5, datetime.timedelta(seconds=42))]


def test_the_default_weight_group_is_gloo_over_host_memory():
    import torch.distributed as dist

    made = accel_backends.DeviceBackend.new_weight_group(CPUBackend(), dist.HashStore(), 0, 1, 5.0)
    assert type(made.group).__name__ == "ProcessGroupGloo" and made.device == torch.device("cpu")


def test_an_adapter_push_is_written_server_side_loaded_as_its_version_and_the_one_before_the_previous_unloaded():
    backend, routes = RecordingDeviceBackend(), []
    pusher = WeightPusher([RecordingClient("http://srv0:8000", routes)], [1], "127.0.0.1", {}, sender=True,
                          settings={"timeout_s": 30.0}, free_port=free_port, backend=backend, lora_rank=4,
                          session="ab12")
    pusher.connect()
    assert [body["init_info"]["lora_rank"] for path, body in routes] == [4, 4]  # the server checks it serves LoRA
    pusher.push(_draws(backend.log))  # the base weights, once: version 1
    assert pusher.adapter is None
    adapter = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 3)}
    routes.clear()
    for _ in range(3):
        pusher.push(iter(adapter.items()), adapter={"r": 4, "lora_alpha": 8})
    paths = [path for path, _ in routes]
    each = ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update", "/v1/load_lora_adapter"]
    assert paths == [*each, "/resume", *each, "/resume", *each, "/v1/unload_lora_adapter", "/resume"], paths
    updates = [body["update_info"] for path, body in routes if path == "/update_weights"]
    assert [u["directory"] for u in updates] == [f"{pusher.adapter_root}/v{v}" for v in (2, 3, 4)]
    assert all(u["kind"] == "adapter" and u["adapter_config"] == {"r": 4, "lora_alpha": 8} for u in updates)
    loads = [body for path, body in routes if path == "/v1/load_lora_adapter"]
    assert [b["lora_name"] for b in loads] == [f"accel-policy-ab12-v{v}" for v in (2, 3, 4)]
    assert [b["lora_path"] for b in loads] == [u["directory"] for u in updates]
    assert [body for path, body in routes if path == "/v1/unload_lora_adapter"] == [
        {"lora_name": "accel-policy-ab12-v2"}]  # a request sent just before a push still names the previous one
    assert (pusher.adapter, pusher.loaded, pusher.version) == ("accel-policy-ab12-v4", [
        "accel-policy-ab12-v3", "accel-policy-ab12-v4"], 4)
    other_rank = WeightPusher([], [], "127.0.0.1", {}, sender=False, session="ab12")
    other_rank.version = 3
    other_rank.push(iter(adapter.items()), adapter={"r": 4})
    assert other_rank.adapter == "accel-policy-ab12-v4"  # every rank names the adapter its requests sample with


def test_a_server_refusing_an_adapter_is_named_and_left_paused():
    """/v1/load_lora_adapter answering 404 (a server without runtime LoRA loading), through the real client: the
    push fails with one line naming the server and what it needs, no /resume (nothing samples from a half-made
    version) and the version not advanced."""
    import http.server
    import threading

    class NoAdapters(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b'{"detail": "Not Found"}')

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NoAdapters)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    class Refusing(RecordingClient):
        def call(self, method, path, body=None, query=None, timeout_s=None):
            if path == "/v1/load_lora_adapter":
                self.log.append((path, body))
                return ServerClient.call(self, method, path, body, query, timeout_s)  # over HTTP, to the 404
            return super().call(method, path, body, query, timeout_s)

    backend, routes = RecordingDeviceBackend(), []
    pusher = WeightPusher([Refusing(url, routes)], [1], "127.0.0.1", {}, sender=True, settings={"timeout_s": 30.0},
                          free_port=free_port, backend=backend, lora_rank=4, session="ab12")
    pusher.connect()
    pusher.push(_draws(backend.log))  # the base weights: version 1
    routes.clear()
    adapter = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 3)}
    try:
        with pytest.raises(ServerError, match=f"vLLM server {url}: POST /v1/load_lora_adapter answered 404 "
                                            r"\(adapters need --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
            pusher.push(iter(adapter.items()), adapter={"r": 4})
    finally:
        server.shutdown()
    assert [path for path, _ in routes][-1] == "/v1/load_lora_adapter" and "/resume" not in dict(routes), routes
    assert (pusher.version, pusher.adapter, pusher.loaded) == (1, None, [])
