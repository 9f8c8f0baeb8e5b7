"""The trainer side of weight pushes through an engine that ships its own (vLLM's ``nccl`` on CUDA, chosen with
``rollout.vllm.weight_transfer``; a third party's), tested against its contract with a clearly labelled RECORDING
STAND-IN: no GPU and no vLLM here. The stand-in trainer engine behaves as vLLM's ``TrainerWeightTransferEngine``
contract says (built on every rank by ``trainer_init``; the sender drives start / update / finish through the client
and checks the iteration against the declared metadata; other ranks only iterate) and records what it was given.
This package's own engine, the default on every device, is tested in test_weight_wire.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.rollout.vllm_server.client import ServerClient, ServerError
from engine.rollout.vllm_server.pusher import WeightPusher
from engine.rollout.vllm_server.settings import trainer_side_problems
from engine.rollout.vllm_server.vllm_wire import VLLMTrainerWire, init_info

WEIGHTS = {"model.embed_tokens.weight": torch.arange(12.0).reshape(4, 3), "lm_head.weight": torch.ones(4, 3),
           "model.norm.weight": torch.full((3,), 2.0, dtype=torch.bfloat16)}


@dataclasses.dataclass
class StandInInitInfo:  # the shape of vLLM's NCCLTrainerInitInfo: the group's place, a wire setting, the rank
    master_address: str
    master_port: int
    world_size: int
    packed: bool = True
    rank: int = dataclasses.field(default=0, kw_only=True)


class RecordingTrainerEngine:
    """Stand-in for a vLLM trainer-side engine (NOT vLLM's code): what it was built with and what it sent."""

    def __init__(self, init_info, client, source) -> None:
        self.init_info, self.client, self.source = init_info, client, source
        self.sent: list[tuple[str, torch.dtype, tuple]] = []
        self.fail_after: int | None = None

    def send_weights(self) -> None:
        meta = self.source.metadata()
        sender = self.init_info.rank == 0
        if sender:
            self.client.start_weight_update()
            self.client.update_weights({"names": [m[0] for m in meta]})
        for index, (name, tensor) in enumerate(self.source):
            if sender:
                assert (name, tensor.dtype, tuple(tensor.shape)) == meta[index], "iteration disagrees with metadata"
                if self.fail_after == index:
                    raise RuntimeError("the device's collective timed out")
                self.sent.append((name, tensor.dtype, tuple(tensor.shape)))
        if sender:
            self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.sent.append(("shutdown", None, ()))


class RecordingFactory:
    """Stand-in for vLLM's WeightTransferTrainerFactory, with one engine registered under ``name``."""

    def __init__(self, name: str) -> None:
        self.name, self.built = name, []

    def init_info_class(self, engine: str) -> type:
        if engine != self.name:
            raise ServerError(f"vLLM has no trainer side for the weight-transfer engine {engine!r} (known: "
                              f"{self.name})")
        return StandInInitInfo

    def param_meta(self, name, dtype, shape):
        return (name, dtype, shape)

    def trainer_init(self, init_info, client, source):
        engine = RecordingTrainerEngine(init_info, client, source)
        self.built.append(engine)
        return engine


class RecordingClient(ServerClient):
    """A server's RL routes, recorded instead of called over HTTP."""

    def __init__(self, url: str, log: list) -> None:
        super().__init__(url)
        self.log = log

    def call(self, method, path, body=None, query=None, timeout_s=None):
        self.log.append((self.url, path, (body or {}).get("weight_version"), (query or {}).get("mode")))
        return {"status": "ok"}

    def healthy(self) -> bool:
        return True


def _pusher(engine: str, rank: int, log: list, draws: list):
    facts_settings = {"timeout_s": 30.0, "packed": False}  # the device's settings: the engine takes what it declares

    def draw():
        draws.append(rank)
        return iter(list(WEIGHTS.items()))

    factory = RecordingFactory(engine)
    wire = VLLMTrainerWire(engine, facts_settings, rank, draw=draw, factory=factory)
    clients = [RecordingClient("http://srv0:8000", log), RecordingClient("http://srv1:8000", log)]
    ports = iter([29500, 29501])
    pusher = WeightPusher(clients, [2, 1], "10.0.0.1", {}, sender=rank == 0, engine=engine,
                          settings=facts_settings, free_port=lambda: next(ports), wire=wire)
    return pusher, factory


@pytest.mark.parametrize("engine", ["nccl", "rdma-x"], ids=["vllm-nccl-stand-in", "third-party-stand-in"])
def test_a_chosen_engine_pushes_versioned_weights_through_its_own_trainer_side(engine):
    log, draws = [], []
    pusher, factory = _pusher(engine, 0, log, draws)
    pusher.connect()
    assert draws == [0]  # the order, names, dtypes and shapes learnt once, before any byte moves
    first, second = factory.built
    assert (first.init_info.master_address, first.init_info.master_port, first.init_info.world_size,
            first.init_info.rank, first.init_info.packed) == ("10.0.0.1", 29500, 3, 0, False)
    unpacked = init_info(StandInInitInfo, {"timeout_s": 1.0}, master_address="h", master_port=1, world_size=2, rank=0)
    assert unpacked.packed is False  # by default: vLLM's packed producer draws on side streams with no wait
    assert init_info(StandInInitInfo, {"packed": True}, master_address="h", master_port=1, world_size=2,
                     rank=0).packed  # a device's settings may still ask for it
    assert (second.init_info.master_port, second.init_info.world_size) == (29501, 2)
    assert first.source.metadata() == [(n, t.dtype, tuple(t.shape)) for n, t in WEIGHTS.items()]

    assert pusher.push(iter(list(WEIGHTS.items()))) == 1
    assert draws == [0, 0]  # the second server's pass is a fresh draw; the first took the weights handed in
    expected = [(n, t.dtype, tuple(t.shape)) for n, t in WEIGHTS.items()]
    assert first.sent == expected and second.sent == expected
    routes = [(url[-6:-5], path, version, mode) for url, path, version, mode in log]
    assert routes == [("0", "/pause", None, "keep"), ("1", "/pause", None, "keep"),
                      ("0", "/start_weight_update", None, None), ("0", "/update_weights", None, None),
                      ("0", "/finish_weight_update", "1", None),
                      ("1", "/start_weight_update", None, None), ("1", "/update_weights", None, None),
                      ("1", "/finish_weight_update", "1", None),
                      ("0", "/resume", None, None), ("1", "/resume", None, None)]
    log.clear()
    pusher.push(iter(list(WEIGHTS.items())))
    assert [v for _, path, v, _ in log if path == "/finish_weight_update"] == ["2", "2"]  # the next version


def test_other_ranks_draw_every_pass_and_call_no_server():
    log, draws = [], []
    pusher, factory = _pusher("nccl", 1, log, draws)
    pusher.connect()
    pusher.push(iter(list(WEIGHTS.items())))
    assert log == []  # only rank 0 talks to the servers
    assert draws == [1, 1]  # but every rank draws what rank 0 draws: the draws are collectives
    assert [engine.init_info.master_port for engine in factory.built] == [0, 0]  # no endpoint of its own
    assert pusher.version == 1


def test_a_push_failing_half_way_leaves_the_servers_paused_and_says_so():
    log, draws = [], []
    pusher, factory = _pusher("rdma-x", 0, log, draws)
    pusher.connect()
    factory.built[0].fail_after = 1
    with pytest.raises(ServerError, match="through the 'rdma-x' engine failed half-way .*stay paused"):
        pusher.push(iter(list(WEIGHTS.items())))
    assert not any(path == "/resume" for _, path, _, _ in log)
    assert pusher.version == 0


def test_an_engine_without_a_trainer_side_is_one_line_before_any_worker():
    assert trainer_side_problems("accel") == trainer_side_problems("gloo") == []  # this package's own (old name)
    (hccl,) = trainer_side_problems("hccl", RecordingFactory("nccl"))  # vllm-ascend's: a worker half only
    assert "no trainer side for the weight-transfer engine 'hccl'" in hccl
    assert trainer_side_problems("nccl", RecordingFactory("nccl")) == []
    (problem,) = trainer_side_problems("rdma-x", RecordingFactory("nccl"))
    assert problem.startswith("rollout.vllm.mode=server: vLLM has no trainer side for the weight-transfer engine "
                              "'rdma-x'")
