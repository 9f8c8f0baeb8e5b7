"""All-gathers per ``FSDPEngine.generate`` call, gather once vs per layer, 3-layer tiny Qwen2, 2 ranks (counted).

Usage: python ci/measure/generate_gathers.py
"""
import sys

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
from distributed import run_ranks  # noqa: E402 - importable once the lines above set the path


def count(rank):
    import torch

    from engine import EngineConfig, FSDPEngine
    from engine.bench.collective_counter import CollectiveCounter
    from engine.tiny_model import tiny_qwen2

    def factory():
        return tiny_qwen2(seed=0, vocab_size=96, layers=3, max_positions=64)
    ids = torch.randint(1, 90, (2, 5), generator=torch.Generator().manual_seed(0))
    out = {}
    for version in (2, 1):
        for lora in (0, 4):
            for gather in ("once", "per_layer"):
                e = FSDPEngine(factory, EngineConfig(fsdp_version=version, lora_rank=lora, generate_gather=gather))
                e.generate(input_ids=ids, max_new_tokens=1, do_sample=False, pad_token_id=0, synced_gpus=True)
                for n in (4, 16):
                    with CollectiveCounter() as c:
                        e.generate(input_ids=ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                   synced_gpus=True)
                    out[(version, lora, gather, n)] = (c.counts["all_gather"], e.num_sharded_units)
    return out


if __name__ == "__main__":
    import generate_gathers
    for key, (ag, units) in run_ranks(generate_gathers.count)[0].items():
        version, lora, gather, n = key
        print(f"FSDP{version} lora={lora} {gather:9s} max_new_tokens={n:2d}: {ag:3d} all-gathers ({units} units)")
