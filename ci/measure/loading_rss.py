"""Peak host memory (RSS) of each rank while FSDPEngine is built from a saved ~100M-parameter model.

Usage: python ci/measure/loading_rss.py MODEL_DIR {rank0|every} [fsdp_version [world_size]]
(MODEL_DIR without a config.json is filled first with a random Qwen2 of 100.1M parameters; 2 ranks by default.
More ranks make each shard smaller, which shows what loading costs above the shard.)
"""
import sys
import threading
import time

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
from distributed import run_ranks  # noqa: E402 - importable once the lines above set the path


def measure(rank, model_dir, on_rank0, version):
    import torch

    # Imported before the baseline, as any trainer has: the model code itself is not what is measured.
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401

    from accel_backends.memory import PeakRSSTracker, process_rss
    from engine import EngineConfig, FSDPEngine

    tracker = PeakRSSTracker()
    sampled = [process_rss()]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            sampled.append(process_rss())
            time.sleep(0.002)

    before = process_rss()
    tracker.reset()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    engine = FSDPEngine(model_dir, EngineConfig(fsdp_version=version, load_on_rank0=on_rank0, lr=1e-4))
    stop.set()
    thread.join()
    peak = max(tracker.observe(), max(sampled))
    ids = torch.randint(0, 16000, (2, 32), generator=torch.Generator().manual_seed(rank))
    with engine.train_mode():
        loss = engine.forward_backward_batch([ids], lambda m, x: m(input_ids=x, labels=x).loss)["loss"]
        engine.optimizer_step()
        loss2 = engine.forward_backward_batch([ids], lambda m, x: m(input_ids=x, labels=x).loss)["loss"]
    from engine.fsdp.offload import local
    shard = sum(local(p).numel() * 4 for p in engine.module.parameters())
    return {"shard_mib": shard / 2**20, "before_mib": before / 2**20, "peak_mib": peak / 2**20,
            "growth_mib": (peak - before) / 2**20,
            "losses": [loss, loss2]}


def save_model(model_dir):
    from engine.tiny_model import tiny_qwen2

    tiny_qwen2(seed=0, vocab_size=16000, hidden_size=768, intermediate_size=2048, layers=12, heads=12, kv_heads=4,
               max_positions=256).save_pretrained(model_dir)


if __name__ == "__main__":
    from pathlib import Path

    import loading_rss

    model_dir, mode = sys.argv[1], sys.argv[2]
    if not Path(model_dir, "config.json").exists():
        save_model(model_dir)
    version = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    world_size = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    results = run_ranks(loading_rss.measure, model_dir, mode == "rank0", version, world_size=world_size,
                        timeout=900)
    for rank, r in enumerate(results):
        print(f"{mode} fsdp{version} {world_size} ranks, rank {rank}: before {r['before_mib']:.0f} MiB, "
              f"peak {r['peak_mib']:.0f} MiB, "
              f"growth {r['growth_mib']:.0f} MiB (own shard {r['shard_mib']:.0f} MiB), losses {r['losses']}")
