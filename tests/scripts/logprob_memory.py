"""Peak host memory of one GRPO log-prob micro-batch: the naive full-vocabulary log-softmax vs
engine.rl.logprobs.

    python tests/scripts/logprob_memory.py --vocab 151936 --batch 8 --prompt 64 --response 256

Each variant runs in its own fresh process (the peak is the kernel's resident high-water mark, reset before the
call), on a 1-layer Qwen2 with the given vocabulary so that the logits dominate. Prints one JSON line.
"""

import argparse
import json
import subprocess
import sys


def naive(model, input_ids, attention_mask, prompt_length, temperature):
    """What the trainer did before: full logits, an fp32 copy scaled by temperature, a full log-softmax."""
    import torch.nn.functional as F

    from engine.rl.logprobs import position_ids

    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids(attention_mask)).logits
    logits = logits[:, prompt_length - 1:-1].float() / temperature
    return F.log_softmax(logits, dim=-1).gather(-1, input_ids[:, prompt_length:].unsqueeze(-1)).squeeze(-1)


def exact_host_peaks():
    """Make freed tensors leave the resident set at once, so the RSS high-water mark counts live tensors only.

    glibc raises its mmap threshold after large frees, and memory freed below it stays resident (and is
    reused unseen by the high-water mark); a fixed threshold turns that off.
    """
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 64 * 1024)  # M_TRIM_THRESHOLD


def measure(variant, vocab, batch, prompt, response, grad):
    exact_host_peaks()
    import torch

    from accel_backends.backends.cpu import CPUBackend
    from engine.rl.logprobs import response_log_probs
    from engine.tiny_model import tiny_qwen2

    model = tiny_qwen2(seed=0, vocab_size=vocab, layers=1, max_positions=prompt + response)
    ids = torch.randint(0, vocab, (batch, prompt + response))
    mask = torch.ones_like(ids)
    backend = CPUBackend()
    fn = naive if variant == "naive" else response_log_probs
    with torch.set_grad_enabled(grad):
        fn(model, ids, mask, prompt, 0.7)  # warm-up: allocator and kernels
        backend.reset_peak_memory_stats()
        before = backend.memory_stats().allocated
        values = fn(model, ids, mask, prompt, 0.7)
        if grad:
            values.sum().backward()
        peak = backend.memory_stats().peak_allocated
    return {"peak_bytes": peak - before, "values": values.detach().double().tolist()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--grad", action="store_true", help="the policy pass: with gradients and backward")
    parser.add_argument("--variant", choices=["naive", "chunked"])
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant, args.vocab, args.batch, args.prompt, args.response, args.grad)))
        return
    results = {}
    for variant in ("naive", "chunked"):
        command = [sys.executable, __file__, "--variant", variant, "--vocab", str(args.vocab), "--batch",
                   str(args.batch), "--prompt", str(args.prompt), "--response", str(args.response)]
        command += ["--grad"] if args.grad else []
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        results[variant] = json.loads(output.strip().splitlines()[-1])
    import torch

    diff = (torch.tensor(results["naive"]["values"]) - torch.tensor(results["chunked"]["values"])).abs().max()
    print(json.dumps({"vocab": args.vocab, "batch": args.batch, "prompt": args.prompt, "response": args.response,
                      "grad": args.grad, "naive_peak_mib": results["naive"]["peak_bytes"] / 2**20,
                      "chunked_peak_mib": results["chunked"]["peak_bytes"] / 2**20,
                      "ratio": results["chunked"]["peak_bytes"] / results["naive"]["peak_bytes"],
                      "max_abs_diff": diff.item()}))


if __name__ == "__main__":
    main()
