"""What each worker runs in the rank-failure cases (importable by spawned processes): a tiny FSDP2 engine trains,
and rank 1 fails in the phase under test."""

import os
import time

FAULT_RANK = 1


class InjectedFault(RuntimeError):
    pass


def mark_fault_time() -> None:
    """Write when the fault fires, so the test measures fault -> clean exit (not the start-up before it)."""
    stamp = os.environ.get("FAULT_STAMP")
    if stamp:
        with open(stamp, "w") as f:
            f.write(repr(time.time()))


def _raise(message):
    def hook(*args):
        mark_fault_time()
        raise InjectedFault(message)

    return hook


def train_with_fault(fault: str, dist_timeout_s: float) -> str:
    import torch
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    from engine import EngineConfig, FSDPEngine

    rank = int(os.environ["RANK"])
    engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2, dist_timeout_s=dist_timeout_s))
    layer = engine.module.model.layers[1]  # a sharded unit in the middle: the other rank is mid-collective
    armed = rank == FAULT_RANK

    def on_forward(module, args, output):
        if fault == "forward":
            _raise("forward of layer 1")()
        if fault == "backward" and module.training:
            (output if torch.is_tensor(output) else output[0]).register_hook(_raise("backward through layer 1"))
        if fault == "stall":
            mark_fault_time()
            time.sleep(600)  # never returns in time: the other rank's collective must time out

    if armed and fault in ("forward", "backward", "stall"):
        layer.register_forward_hook(on_forward)
    if armed and fault == "step":
        engine.optimizer.register_step_pre_hook(_raise("optimizer step"))
    with engine.train_mode():
        for step in range(3):
            engine.forward_backward_batch(make_micro_batches(seed=10 * rank + step, count=2), token_loss)
            engine.optimizer_step()
    return "finished"


def wait_forever(marker_dir: str) -> None:
    """Report this worker's pid, then wait (for the test that kills the launcher itself)."""
    with open(os.path.join(marker_dir, f"rank{os.environ['RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


if __name__ == "__main__":  # a launcher for the test to kill: python rank_faults.py MARKER_DIR
    import sys

    from engine.runtime import run

    run(wait_forever, 2, sys.argv[1])
