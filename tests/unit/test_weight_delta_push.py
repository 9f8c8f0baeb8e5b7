"""Delta weight sync end to end without vLLM (issue 48 item 3): a real policy (FSDP2, bf16, Adam at lr 1e-5) trained
for several steps, each update pushed through this package's weight wire with ``weight_sync=delta``; the receiving
side (what a server's worker runs: ``weight_wire.receive`` into a ``weight_delta.ReceivedCopy``) holds the policy's
weights bit for bit after every push, the pushes after the first move fewer bytes than the model, and a server that
reports another version (restarted) gets the next push whole.

The weight group is a RECORDING STAND-IN (``test_weight_wire.RecordingGroup``: the broadcasts' bytes replayed on the
receiving side); the real gloo group and vLLM's workers run in the vLLM leg."""

from __future__ import annotations

import functools

import pytest
import torch

import accel_backends
from accel_backends import WeightGroup
from accel_backends.spawn import free_port
from engine import EngineConfig, FSDPEngine
from engine.rollout.vllm_server import weight_wire
from engine.rollout.vllm_server.pusher import WeightPusher
from engine.rollout.weight_delta import ReceivedCopy, bits
from engine.tiny_model import tiny_qwen2
from tests.unit.test_weight_wire import RecordingClient, RecordingDeviceBackend, ReplayGroup


class VersionedRecordingClient(RecordingClient):
    """A recorded server that reports the version of its last finished push (None: restarted, nothing pushed)."""

    reported: str | None = None

    def call(self, method, path, body=None, query=None, timeout_s=None):
        if path == "/weight_info":
            return {"weight_version": self.reported}
        answer = super().call(method, path, body, query, timeout_s)
        if path == "/finish_weight_update":
            self.reported = (body or {}).get("weight_version")
        return answer


@pytest.fixture(scope="module")
def cpu():
    torch.set_num_threads(1)
    backend = accel_backends.get_backend("cpu")
    backend.init_distributed()
    yield backend
    torch.distributed.destroy_process_group()  # later in-process tests must not see a group left behind


def _train_step(policy: FSDPEngine, generator: torch.Generator) -> None:
    ids = torch.randint(0, 97, (2, 12), generator=generator)
    with policy.train_mode():
        logits = policy.module(input_ids=ids).logits.float()
        torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1)).backward()
        policy.optimizer_step()


def test_every_delta_push_leaves_the_receiver_bit_equal_to_the_policy(cpu):
    policy = FSDPEngine(functools.partial(tiny_qwen2, seed=0, vocab_size=97, hidden_size=64, layers=2,
                                          max_positions=64),
                        EngineConfig(mixed_precision="bf16", lr=1e-5, max_grad_norm=None), backend=cpu)
    device, client = RecordingDeviceBackend(), VersionedRecordingClient("http://srv0:8000", [])
    pusher = WeightPusher([client], [1], "127.0.0.1", {}, sender=True, settings={"timeout_s": 30.0},
                          free_port=free_port, backend=device, weight_sync="delta")
    pusher.connect()
    joined = [body["init_info"] for path, body in client.log if path == "/init_weight_transfer_engine"]
    assert joined[-1]["weight_sync"] == "delta"  # the worker keeps its copy
    (group,) = pusher.groups
    receiver, generator, figures = ReceivedCopy(), torch.Generator().manual_seed(0), []
    model_bytes = sum(t.numel() * t.element_size() for _, t in policy.iter_full_weights())
    for step in range(6):
        if step == 4:
            client.reported, receiver = None, ReceivedCopy()  # the server restarted: its copy is gone
        if step:
            _train_step(policy, generator)
        group.group.sent.clear()
        logged = len(device.log)
        pusher.push(policy.iter_full_weights())
        replay = WeightGroup(ReplayGroup(group.group.sent), torch.device("cpu"))
        for name, message in weight_wire.receive(replay):
            receiver.take(name, message)
        policy_weights = {name: tensor.clone() for name, tensor in policy.iter_full_weights()}
        assert set(receiver.copy) == set(policy_weights)
        for name, tensor in policy_weights.items():
            assert tensor.dtype == torch.bfloat16 and torch.equal(bits(receiver.copy[name]), bits(tensor)), (step, name)
        uint8 = sum(entry[2] for entry in device.log[logged:] if entry[0] == "broadcast" and entry[1] == torch.uint8)
        payloads = uint8 - sum(len(name.encode()) for name in policy_weights)  # the names go as bytes too
        figures.append((pusher.stats.wire_bytes, pusher.stats.changed_frac, payloads))
    assert figures[0][0] == model_bytes and figures[4][0] == model_bytes  # the first push, and after the restart
    for step in (1, 2, 3, 5):
        wire_bytes, changed, _ = figures[step]
        assert 0 < changed < 1 and wire_bytes < model_bytes, (step, figures)
    assert all(wire_bytes == payloads for wire_bytes, _, payloads in figures), figures  # the figure is the wire's
