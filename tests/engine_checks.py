"""Helpers the engine tests run inside each rank (importable by spawned processes)."""

import torch
from torch.distributed.tensor import DTensor

from accel_backends.backends.cpu import CPUBackend
from engine.bench.collective_counter import CollectiveCounter  # noqa: F401 - the tests import it from here


def full_grads(engine):
    """Every gradient as a full (unsharded) tensor, by the parameter's name in the unwrapped model."""
    if engine.fsdp_version != 1:  # FSDP2 or unwrapped (one rank)
        return {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
                for n, p in engine.module.named_parameters() if p.grad is not None}
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(engine.module, with_grads=True):
        return {n.replace("_fsdp_wrapped_module.", ""): p.grad.clone()
                for n, p in engine.module.named_parameters() if p.grad is not None}


def full_params(engine):
    if engine.fsdp_version != 1:  # FSDP2 or unwrapped (one rank)
        return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                for n, p in engine.module.named_parameters()}
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(engine.module):
        return {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
                for n, p in engine.module.named_parameters()}


def assert_grads_close(got, want, atol=1e-5, rtol=1e-4):
    assert set(got) == set(want), f"different parameters: {sorted(set(got) ^ set(want))[:5]}"
    worst = max((got[n] - want[n]).abs().max().item() for n in want)
    for name in want:
        assert torch.allclose(got[name], want[name], atol=atol, rtol=rtol), (name, worst)
    return worst




class CopyingCPUBackend(CPUBackend):
    """TEST STAND-IN: a CPU backend whose moves really copy into new storage and are counted.

    On the plain CPU backend host and device are the same memory, so offload moves nothing. This stand-in makes
    every move a real copy, so the tests exercise what an accelerator would: storage that changes under FSDP.
    """

    name = "cpu-copying"

    def __init__(self):
        super().__init__()
        from collections import Counter

        self.moves = Counter()

    def to_device(self, tensor, non_blocking=False):
        self.moves["to_device"] += 1
        return tensor.clone()

    def to_host(self, tensor, non_blocking=False):
        self.moves["to_host"] += 1
        return tensor.clone()


def local_state(engine):
    """This rank's parameter shards and optimizer state, copied, keyed by name (for bitwise comparisons)."""
    from engine.fsdp.offload import local

    state = {f"param:{n}": local(p).detach().clone() for n, p in engine.module.named_parameters()}
    for i, param_state in enumerate(engine.optimizer.state.values()):
        for key, value in param_state.items():
            if torch.is_tensor(value):
                state[f"optim:{i}:{key}"] = local(value).detach().clone()
    return state


def assert_bitwise_equal(a, b):
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key].cpu(), b[key].cpu()), key
