"""Peak host memory of one SFT micro-batch's loss, forward and backward: the full-vocabulary fp32 cross-entropy
the trainer computed before vs engine/offline/objectives/sft/loss.py's chunked one.

    python tests/scripts/sft_loss_memory.py --vocab 32768 --sequences 8 --length 512

Each variant runs in its own fresh process (the peak is the kernel's resident high-water mark, reset before the
call, as in logprob_memory.py), on a 1-layer Qwen2 with the given vocabulary so that the logits dominate; every
position is supervised. Prints one JSON line with both peaks and the differences of loss and gradients.
"""

import argparse
import json
import subprocess
import sys

from logprob_memory import exact_host_peaks


def naive(module, micro):
    """What the SFT objective's token_loss did before: fp32 logits of every scored position at once."""
    import torch.nn.functional as F

    layout, mask = micro.layout, micro.mask
    logits = layout.select(module(**layout.inputs, logits_to_keep=layout.logits_to_keep, use_cache=False).logits)
    logits = logits.float()
    loss = (F.cross_entropy(logits, layout.targets, reduction="none") * mask).sum() / mask.sum()
    return loss, ((logits.detach().argmax(-1) == layout.targets).float() * mask).sum() / mask.sum()


def chunked(module, micro):
    import torch

    from engine.offline.objectives.sft.trainer import token_loss

    loss, _, metrics = token_loss(module, micro, torch.device("cpu"))
    return loss, metrics["mean_token_accuracy"]


def measure(variant, vocab, sequences, length):
    exact_host_peaks()
    import torch

    from accel_backends.backends.cpu import CPUBackend
    from engine.offline.masks import Tokenized
    from engine.offline.sequences import MicroBatch, sequence_batch
    from engine.packing import build_layout
    from engine.tiny_model import tiny_qwen2

    model = tiny_qwen2(seed=0, vocab_size=vocab, layers=1, max_positions=length)
    generator = torch.Generator().manual_seed(0)
    items = [Tokenized(torch.randint(0, vocab, (length,), generator=generator).tolist(), [1] * length, "t")
             for _ in range(sequences)]
    batch, masks = sequence_batch(items)
    layout = build_layout(batch, list(range(sequences)), packed=False)
    micro = MicroBatch(layout, masks[layout.rows, batch.starts[layout.rows] + layout.columns])
    fn = naive if variant == "naive" else chunked
    backend = CPUBackend()
    fn(model, micro)[0].backward()  # warm-up: allocator and kernels
    model.zero_grad(set_to_none=True)
    backend.reset_peak_memory_stats()
    before = backend.memory_stats().allocated
    loss, accuracy = fn(model, micro)
    loss.backward()
    peak = backend.memory_stats().peak_allocated
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return {"peak_bytes": peak - before, "loss": loss.item(), "accuracy": float(accuracy),
            "supervised_tokens": int(micro.mask.sum()), "grads": grads.double().tolist()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--variant", choices=["naive", "chunked"])
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant, args.vocab, args.sequences, args.length)))
        return
    results = {}
    for variant in ("naive", "chunked"):
        command = [sys.executable, __file__, "--variant", variant, "--vocab", str(args.vocab), "--sequences",
                   str(args.sequences), "--length", str(args.length)]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        results[variant] = json.loads(output.strip().splitlines()[-1])
    import torch

    naive_grads, chunked_grads = (torch.tensor(results[v]["grads"]) for v in ("naive", "chunked"))
    print(json.dumps({"vocab": args.vocab, "supervised_tokens": results["chunked"]["supervised_tokens"],
                      "naive_peak_mib": results["naive"]["peak_bytes"] / 2**20,
                      "chunked_peak_mib": results["chunked"]["peak_bytes"] / 2**20,
                      "ratio": results["chunked"]["peak_bytes"] / results["naive"]["peak_bytes"],
                      "loss_diff": abs(results["naive"]["loss"] - results["chunked"]["loss"]),
                      "accuracy_diff": abs(results["naive"]["accuracy"] - results["chunked"]["accuracy"]),
                      "grad_max_rel_diff": ((naive_grads - chunked_grads).abs().max()
                                            / naive_grads.abs().max()).item()}))


if __name__ == "__main__":
    main()
