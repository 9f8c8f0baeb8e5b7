"""The rollout card hands the trainer's forward its tokens on the policy's device. A rollout engine returns its batch
on the host; the card's first GPU run (H100, 5 December 2026) failed both of its measured properties with "index is
on cpu, different from other tensors on cuda:0". Here the backend's device is ``meta`` (any device but the host),
and a recording module stands in for the policy's model."""

from types import SimpleNamespace

import pytest
import torch

from engine.rl import certify_rollout


class Recorded(Exception):
    """Raised by the recording module once it has seen its inputs: the test needs nothing past them."""


class RecordingModule:
    def __init__(self):
        self.devices = None

    def __call__(self, **inputs):
        self.devices = {name: value.device.type for name, value in inputs.items() if isinstance(value, torch.Tensor)}
        raise Recorded


class StandInPolicy:
    """What the card uses of the FSDP engine: its backend's device, its module, its modes and one update."""

    def __init__(self):
        self.module = RecordingModule()
        self.backend = SimpleNamespace(device=lambda: torch.device("meta"))

    def eval_mode(self):
        return torch.no_grad()

    train_mode = eval_mode

    def forward_backward_batch(self, micro_batches, step):
        for micro in micro_batches:
            step(self.module, micro)


def _host_batch():
    input_ids = torch.tensor([[0, 5, 6, 7, 8], [3, 4, 6, 9, 2]])
    return SimpleNamespace(input_ids=input_ids, attention_mask=torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]),
                           prompt_length=2, response_mask=torch.ones(2, 3))


@pytest.mark.parametrize("use", ["trainer_log_probs", "update"])
def test_the_trainer_reads_the_rollout_batch_on_the_policy_device(use):
    setup = certify_rollout.Setup(policy=StandInPolicy(), engine=None, tokenizer=None, eos=(2,))
    batch = _host_batch()
    with pytest.raises(Recorded):
        if use == "update":
            certify_rollout._update(setup, batch)
        else:
            certify_rollout._trainer_log_probs(setup, batch)
    assert set(setup.policy.module.devices) >= {"input_ids", "attention_mask", "position_ids"}
    assert set(setup.policy.module.devices.values()) == {"meta"}, setup.policy.module.devices
    assert batch.input_ids.device.type == "cpu"  # the engine's batch itself is left where it was
