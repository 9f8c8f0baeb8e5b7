"""vLLM alone: how fast vLLM decodes the benchmark's model by itself, by thread count and binding, so the GRPO
step's rollout phase (``rollout.engine=vllm``, the ``grpo`` scenario of the same run) can be read against it.

Rank 0 starts one fresh process per variant (vLLM reads its thread settings once, at start): ``OMP_NUM_THREADS``
unbound (``VLLM_CPU_OMP_THREADS_BIND=nobind``, as the colocated engine runs beside the trainer on the CPU) or bound
to cores (``VLLM_CPU_OMP_THREADS_BIND=0`` / ``0-1``, vLLM's own default when it has the machine to itself). Each
process loads the model directory (``--grpo-model-dir``, or the long case's model), samples the step's geometry
(``--vllm-prompts`` prompts x ``--vllm-n`` responses of up to ``--vllm-max-tokens`` tokens; the model's EOS ends
them) once to warm up and ``--steps`` times timed, and reports response tokens per second. The variants run one
after the other, each alone on the machine (the other ranks wait); a variant that needs more cores than this
process may use is skipped and said so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

VARIANTS = (("1 thread, unbound", 1, "nobind"), ("2 threads, unbound", 2, "nobind"),
            ("1 thread, bound to core 0", 1, "0"), ("2 threads, bound to cores 0-1", 2, "0-1"))


def run(options, backend, rank) -> dict:
    return on_rank_0(measure, options, rank)


def on_rank_0(measure, options, rank) -> dict:
    """``measure(options)`` on rank 0 alone, in fresh processes of its own; the other ranks wait at a barrier, so
    every measured process has the machine to itself."""
    import torch.distributed as dist

    result = measure(options) if rank == 0 else {}
    if dist.is_initialized():
        dist.barrier()
    return result


def measure(options) -> dict:
    model_dir = options.get("vllm_model_dir")
    if not model_dir:
        raise ValueError("the vllm_alone scenario needs a model directory: --grpo-model-dir DIR or --grpo-case long")
    cores = len(os.sched_getaffinity(0))
    work = {"model_dir": str(model_dir), "prompts": options["vllm_prompts"], "n": options["vllm_n"],
            "max_tokens": options["vllm_max_tokens"], "rounds": options["steps"]}
    variants = {}
    for label, threads, binding in VARIANTS:
        if threads > cores:
            variants[label] = {"skipped": f"needs {threads} cores, this process may use {cores}"}
            continue
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": binding,
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               "TOKENIZERS_PARALLELISM": "false"}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "engine.bench.vllm_alone", json.dumps(work)], env=env,
                              capture_output=True, text=True, timeout=options.get("vllm_timeout_s", 1200))
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"vLLM alone ({label}) failed with exit {done.returncode}: {tail}")
        variants[label] = {**json.loads(lines[-1]), "process_s": time.perf_counter() - started}
    return {"work": work, "variants": variants}


def _child(work: dict) -> dict:
    """In a fresh process: load the model, sample the geometry ``rounds + 1`` times, time all but the first."""
    import torch
    from vllm import LLM, SamplingParams

    llm = LLM(model=work["model_dir"], skip_tokenizer_init=True, dtype="float32", enforce_eager=True, seed=0,
              generation_config="vllm", enable_chunked_prefill=False)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    generator = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(3, vocab, (24,), generator=generator).tolist()}
               for _ in range(work["prompts"])]
    seconds, tokens = [], []
    for round_index in range(work["rounds"] + 1):
        params = [SamplingParams(n=work["n"], max_tokens=work["max_tokens"], temperature=1.0, detokenize=False,
                                 seed=1000 * round_index + i) for i in range(work["prompts"])]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        if round_index:
            seconds.append(elapsed)
            tokens.append(sum(len(c.token_ids) for o in outputs for c in o.outputs))
    order = sorted(range(len(seconds)), key=lambda i: seconds[i])
    middle = order[len(order) // 2]
    return {"threads": int(os.environ["OMP_NUM_THREADS"]), "binding": os.environ["VLLM_CPU_OMP_THREADS_BIND"],
            "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens[middle] / seconds[middle],
            "tokens_per_s_all": [t / s for t, s in zip(tokens, seconds, strict=True)]}


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
