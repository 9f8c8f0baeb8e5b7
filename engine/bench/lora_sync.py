"""LoRA with vLLM, ``rollout.vllm.lora_sync`` merged against adapter: push time and bytes per update, and decode
tokens per second, side by side (docs/perf.md, "LoRA with vLLM").

Rank 0 starts two fresh processes per geometry (``--lora-geometries``: ``mid``, hidden 512 x 8 layers; ``large``,
hidden 1024 x 16 layers), one a LoRA policy (rank ``--lora-rank``, one process, FSDP2) with a colocated vLLM engine in
``merged`` mode, the other in ``adapter`` mode, both alive at once and driven in turn (merged, adapter, merged...),
one thread each: every round one changes the adapter as an update would (every LoRA tensor moved), pushes it
(``sync_weights``: timed, bytes counted) and decodes ``--vllm-prompts`` prompts x ``--vllm-n`` responses of
``--vllm-max-tokens`` tokens (timed, tokens counted). The first push (merged: the model; adapter: the base once and
the adapter) is reported on its own. Ratios are medians over rounds of each round's ratio. The ``auto`` rule follows
from these figures (``engine/rollout/engines/lora_sync.py``): what adapter mode saves per push against what its
decoding costs per update.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GEOMETRIES = {"mid": {"hidden_size": 512, "layers": 8}, "large": {"hidden_size": 1024, "layers": 16}}
MODES = ("merged", "adapter")


def run(options, backend, rank) -> dict:
    from .vllm_alone import on_rank_0

    return on_rank_0(measure, options, rank)


def measure(options) -> dict:
    work = {"prompts": options["vllm_prompts"], "n": options["vllm_n"], "max_tokens": options["vllm_max_tokens"],
            "rank": options["lora_rank"]}
    figures = {}
    for geometry in options["lora_geometries"]:
        with tempfile.TemporaryDirectory(prefix="accel-bench-lora-") as scratch:
            figures[geometry] = _side_by_side({**work, **GEOMETRIES[geometry], "scratch": scratch},
                                              options["steps"], options.get("vllm_timeout_s", 1200))
    return {"work": work, "geometries": figures}


def _side_by_side(work: dict, rounds: int, timeout_s: float) -> dict:
    from accel_backends.spawn import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "ACCEL_BACKEND": "cpu",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "TOKENIZERS_PARALLELISM": "false",
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    children = {mode: subprocess.Popen([sys.executable, "-m", "engine.bench.lora_sync",
                                        json.dumps({**work, "mode": mode})], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True,
                                       env={**env, "MASTER_PORT": str(free_port())})  # a job of one rank each
                for mode in MODES}
    try:
        first = {mode: _answer(child, timeout_s) for mode, child in children.items()}  # built, first push done
        rows = {mode: [] for mode in MODES}
        for _ in range(rounds + 1):  # the first round warms up
            for mode, child in children.items():
                child.stdin.write("round\n")
                child.stdin.flush()
                rows[mode].append(_answer(child, timeout_s))
        for child in children.values():
            child.stdin.close()
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
            child.wait()
    rows = {mode: runs[1:] for mode, runs in rows.items()}
    return {**{mode: _summary(first[mode], rows[mode]) for mode in MODES}, "ratios": _ratios(rows)}


def _answer(child, timeout_s: float) -> dict:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        line = child.stdout.readline()
        if not line:
            raise RuntimeError(f"a lora_sync bench process ended (exit {child.poll()}): see its output above")
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"a lora_sync bench process gave no answer within {timeout_s:g} s")


def _summary(first: dict, rows: list[dict]) -> dict:
    return {**first, "push_s": statistics.median(r["push_s"] for r in rows),
            "push_bytes": statistics.median(r["push_bytes"] for r in rows),
            "decode_tokens_per_s": statistics.median(r["tokens"] / r["decode_s"] for r in rows),
            "rounds": rows}


def _ratios(rows: dict) -> dict:
    merged, adapter = rows["merged"], rows["adapter"]

    def median(key):
        return statistics.median(a[key] / m[key] for m, a in zip(merged, adapter, strict=True))

    decode = statistics.median((a["tokens"] / a["decode_s"]) / (m["tokens"] / m["decode_s"])
                               for m, a in zip(merged, adapter, strict=True))
    return {"adapter_over_merged_push_s": median("push_s"), "adapter_over_merged_bytes": median("push_bytes"),
            "adapter_over_merged_decode_tokens_per_s": decode}


def _child(work: dict) -> None:
    """One mode's process: build, push once, then one round per ``round`` line on stdin."""
    import torch

    from engine import EngineConfig, FSDPEngine
    from engine.demo_model import make_tiny_model
    from engine.rl.algorithms.grpo.schema import RolloutConfig
    from engine.rollout import sync_weights
    from engine.rollout.engines import RolloutContext, SamplingConfig, create_rollout_engine
    from engine.rollout.engines.vllm_settings import VLLMConfig

    model_dir = make_tiny_model(os.path.join(work["scratch"], work["mode"]), hidden_size=work["hidden_size"],
                                layers=work["layers"], eos_bias=0.0)
    policy = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2, lora_rank=work["rank"],
                                                     lora_alpha=2 * work["rank"]))
    config = RolloutConfig(engine="vllm", vllm=VLLMConfig(lora_sync=work["mode"], kv_cache_gib=1.0))
    engine = create_rollout_engine("vllm", RolloutContext(policy, None, str(model_dir), config, 512))
    started = time.perf_counter()
    first_bytes = sync_weights(policy, engine)
    print(json.dumps({"first_push_s": time.perf_counter() - started, "first_push_bytes": first_bytes,
                      "parameters": sum(p.numel() for p in policy.module.parameters())}), flush=True)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 2000, (24,), generator=generator).tolist() for _ in range(work["prompts"])]
    sampling = SamplingConfig(n=work["n"], max_new_tokens=work["max_tokens"], eos_token_ids=(), temperature=1.0)
    for index, _ in enumerate(sys.stdin):
        with torch.no_grad():  # as an update would: every LoRA tensor moves
            for name, param in policy.module.named_parameters():
                if ".lora_" in name:
                    local = param.to_local() if hasattr(param, "to_local") else param
                    local.add_(torch.randn(local.shape, generator=generator) * 1e-3)
        started = time.perf_counter()
        pushed = sync_weights(policy, engine)
        push_s = time.perf_counter() - started
        torch.manual_seed(index)
        started = time.perf_counter()
        responses = engine.generate(prompts, sampling)
        print(json.dumps({"push_s": push_s, "push_bytes": pushed, "decode_s": time.perf_counter() - started,
                          "tokens": int(responses.mask.sum())}), flush=True)
    engine.close()


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
