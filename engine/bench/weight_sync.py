"""Weight sync over the wire, ``rollout.vllm.weight_sync`` full against delta, and the LoRA adapter alone: bytes and
push time per update, and the share of elements whose bits change per step (docs/perf.md, "Delta weight sync").

A fresh one-rank process per case (``--weight-sync-dtypes`` x ``--weight-sync-lrs``) trains the mid-size policy
(hidden 512 x 8 layers, vocabulary 2048; FSDP2, Adam, next-token loss on random tokens) for ``--steps`` updates and
after each pushes it twice over this package's weight wire (``weight_wire``, the device backend's weight group, to a
receiving thread in the same process, which applies what it gets as a server's worker does, vLLM's loader aside):
delta first (``weight_delta.SentCopy``), then whole; each push timed from the first draw to the receiver's last
write. The receiver's copy is checked bit-equal to the policy after the last update. The LoRA row: the same geometry
with a rank-8 adapter (``--lora-rank``), its adapter alone pushed whole after each update.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time

GEOMETRY = {"hidden_size": 512, "layers": 8, "vocab_size": 2048}  # lora_sync's "mid"


def run(options) -> dict:
    """In the launcher: one child process per case, in turn."""
    cases = {}
    for dtype in options["weight_sync_dtypes"]:
        for lr in options["weight_sync_lrs"]:
            cases[f"{dtype} lr {lr:g}"] = _child_run({"dtype": dtype, "lr": lr, "steps": options["steps"]})
        cases[f"{dtype} lora"] = _child_run({"dtype": dtype, "lr": 1e-5, "steps": options["steps"],
                                             "lora_rank": options["lora_rank"]})
    return {"geometry": GEOMETRY, "cases": cases}


def _child_run(work: dict) -> dict:
    from accel_backends.spawn import free_port

    env = {**os.environ, "ACCEL_BACKEND": os.environ.get("ACCEL_BACKEND", "cpu"), "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    done = subprocess.run([sys.executable, "-m", "engine.bench.weight_sync", json.dumps(work)], env=env,
                          stdout=subprocess.PIPE, text=True, check=False)
    answers = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not answers:
        raise RuntimeError(f"a weight_sync bench process ended (exit {done.returncode}): see its output above")
    return json.loads(answers[-1])


class Receiver:
    """The server worker's half in a thread: every push into a ``ReceivedCopy``; ``done`` gets one item per push."""

    def __init__(self, group) -> None:
        from ..rollout.weight_delta import ReceivedCopy

        self.group, self.copy, self.done = group, ReceivedCopy(), queue.Queue()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        from ..rollout.vllm_server import weight_wire

        while not self.stopping:
            for name, message in weight_wire.receive(self.group):
                self.copy.take(name, message)
            self.done.put(True)

    def stop(self, sender_group) -> None:
        """End the thread with an empty push (it waits in a broadcast until one comes)."""
        self.stopping = True
        _push(sender_group, self, [])
        self.thread.join()


def _groups(backend):
    """The weight group's two ends (trainer, receiver) over an in-process store."""
    import torch.distributed as dist

    store, ends = dist.HashStore(), {}
    threads = [threading.Thread(target=lambda r=r: ends.__setitem__(r, backend.new_weight_group(store, r, 2, 120.0)))
               for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ends[0], ends[1]


def _push(group, receiver: Receiver, weights, message=None) -> tuple[float, int]:
    """Seconds from the first draw to the receiver's last write, and the payload bytes sent."""
    from ..rollout.vllm_server import weight_wire
    from ..rollout.weight_delta import Delta, nbytes

    started, sent = time.perf_counter(), 0
    for name, tensor in weights:
        item = message(name, tensor) if message else tensor
        sent += item.nbytes if isinstance(item, Delta) else nbytes(item)
        weight_wire.send([group], name, item)
    weight_wire.send_end([group])
    receiver.done.get(timeout=600)
    return time.perf_counter() - started, sent


def _case(work: dict) -> dict:
    import functools

    import torch

    import accel_backends
    from engine import EngineConfig, FSDPEngine
    from engine.rollout.weight_delta import SentCopy, bits
    from engine.tiny_model import tiny_qwen2

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    backend = accel_backends.get_backend()
    backend.init_distributed()
    lora = int(work.get("lora_rank", 0))
    policy = FSDPEngine(functools.partial(tiny_qwen2, seed=0, max_positions=256, **GEOMETRY),
                        EngineConfig(mixed_precision=work["dtype"], lr=work["lr"], lora_rank=lora,
                                     lora_alpha=2 * lora or 16), backend=backend)
    sender, receiving = _groups(backend)
    receiver, copy, generator = Receiver(receiving), SentCopy(), torch.Generator().manual_seed(0)
    draw = policy.iter_adapter_weights if lora else policy.iter_full_weights
    first_s, first_bytes = _push(sender, receiver, draw(), None if lora else copy.message)
    rows = []
    for _ in range(work["steps"]):
        ids = torch.randint(0, GEOMETRY["vocab_size"], (4, 64), generator=generator).to(backend.device())
        with policy.train_mode():
            policy.module(input_ids=ids, labels=ids).loss.backward()
            policy.optimizer_step()
        if lora:
            push_s, sent = _push(sender, receiver, draw())
            rows.append({"adapter_push_s": push_s, "adapter_bytes": sent})
            continue
        copy.start()
        delta_s, delta_bytes = _push(sender, receiver, draw(), copy.message)
        full_s, full_bytes = _push(sender, receiver, draw())
        rows.append({"delta_push_s": delta_s, "delta_bytes": delta_bytes, "full_push_s": full_s,
                     "full_bytes": full_bytes, "changed_frac": copy.stats.changed_frac})
    exact = lora or all(torch.equal(bits(receiver.copy.copy[name]), bits(tensor)) for name, tensor in draw())
    receiver.stop(sender)
    medians = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    return {**work, "first_push_s": first_s, "first_push_bytes": first_bytes, "bit_equal": bool(exact),
            "parameters": sum(p.numel() for p in policy.module.parameters()), "median": medians, "steps": rows}


if __name__ == "__main__":
    print(json.dumps(_case(json.loads(sys.argv[1]))), flush=True)
