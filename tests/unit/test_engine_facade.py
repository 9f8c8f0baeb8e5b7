"""engine/facade: the parts of FSDPEngine that need no process group, checked on their own."""

import pytest
import torch
import torch.nn as nn

from engine.config import EngineConfig
from engine.facade import mini_batch
from engine.facade.module_mode import ModuleMode
from engine.facade.residency import Residency

CPU = torch.device("cpu")


def _counting_train(monkeypatch):
    calls = []
    original = nn.Module.train

    def counted(self, mode=True):
        calls.append(mode)
        return original(self, mode)

    monkeypatch.setattr(nn.Module, "train", counted)
    return calls


def test_module_mode_walks_the_model_only_when_a_mode_may_differ(monkeypatch):
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout(), nn.Linear(2, 2)))
    modes = ModuleMode(model)
    modes.enter(True)
    modes.leave()
    calls = _counting_train(monkeypatch)
    for _ in range(3):
        modes.enter(True)
        modes.leave()
    assert calls == []  # already in train mode: two attribute reads, no walk
    modes.enter(True)
    modes.enter(False)  # nested eval: every submodule follows
    assert {m.training for m in model.modules()} == {False}
    modes.leave()  # back to the enclosing train context
    assert {m.training for m in model.modules()} == {True}
    modes.leave()
    model.eval()  # behind the engine's back: the root's flag reveals it
    modes.enter(True)
    assert {m.training for m in model.modules()} == {True}


def test_unpack_accepts_a_loss_a_pair_or_a_triple_and_names_anything_else():
    loss = torch.tensor(2.0)
    assert mini_batch.unpack(loss, CPU)[1].item() == 1.0  # the default weight
    _, weight, extra = mini_batch.unpack((loss, 3, {"acc": 0.5}), CPU)
    assert weight.dtype == torch.int64 and weight.item() == 3 and extra == {"acc": 0.5}  # a count stays exact
    assert mini_batch.unpack((loss, torch.tensor(2**24 + 1)), CPU)[1].item() == 2**24 + 1
    assert mini_batch.unpack((loss, 2.5), CPU)[1].dtype == torch.float32
    with pytest.raises(TypeError, match="a tuple of 4"):
        mini_batch.unpack((loss, 1, {}, None), CPU)
    with pytest.raises(TypeError, match="scalar tensor"):
        mini_batch.unpack(torch.ones(2), CPU)


def test_weighted_means_count_a_sequence_parallel_group_once_and_refuse_no_weight():
    sums = {"loss": torch.tensor(12.0), "weight": torch.tensor(8.0), "acc": torch.tensor(2.0)}
    total, means = mini_batch.weighted_means(sums, group_size=2)  # two ranks gave each weight alike
    assert total.item() == 4.0 and means["loss"].item() == 3.0 and means["acc"].item() == 0.5
    assert "weight" in sums  # the caller's sums are left as they were
    with pytest.raises(ValueError, match="sum to .* over all ranks"):
        mini_batch.weighted_means({"loss": torch.tensor(0.0), "weight": torch.tensor(0.0)}, group_size=1)


def test_residency_moves_each_part_once_with_its_gradients_and_names_what_is_away():
    from types import SimpleNamespace

    from engine_checks import CopyingCPUBackend

    backend = CopyingCPUBackend()  # every move a real copy, counted
    module = nn.Linear(3, 2)
    module(torch.ones(1, 3)).sum().backward()
    engine = SimpleNamespace(module=module, optimizer=None, fsdp_version=0)  # one rank, no FSDP wrapper
    residency = Residency(EngineConfig(param_offload=True), backend)
    assert residency.offloaded(("params", "optimizer")) == []  # nothing is in host memory yet
    with pytest.raises(ValueError, match="gradients exist and must move with their parameters"):
        residency.move(engine, "cpu", model=True, optimizer=True, grad=False)
    residency.move(engine, "cpu", model=True, optimizer=True, grad=True)
    assert residency.as_dict() == {"params": "cpu", "optimizer": "device"}  # no optimizer: nothing to move
    assert backend.moves["to_host"] == 4  # weight, bias and both gradients
    residency.move(engine, "cpu", model=True, optimizer=True, grad=True)  # already there: not touched
    assert backend.moves["to_host"] == 4
    assert residency.offloaded(("params", "optimizer")) == ["params"]  # only what the config offloads
    with pytest.raises(RuntimeError, match="generation needs params on the device"):
        residency.require_on_device("generation", ["params", "optimizer"])
    with pytest.raises(ValueError, match="device must be"):
        residency.move(engine, "disk", model=True, optimizer=True, grad=True)
    residency.move(engine, "device", model=True, optimizer=False, grad=True)
    assert residency["params"] == "device" and backend.moves["to_device"] == 4
