"""Model directories at a real model's geometry, built from a config with random weights (no download), for the GPU
check's GRPO and SFT steps: ``python ci/geometry.py DIR --geometry NAME``.

The geometry is what decides a step's FLOPs, memory and kernel shapes: layers, hidden size, attention and KV heads,
head size, MLP width and the vocabulary (151936 for Qwen: the LM head and log-softmax over it are a large share of
a small model's work), so those are the real ones. The tokenizer is the demo's small byte-level BPE
(``engine.demo_model.build_tokenizer``): the model's vocabulary is larger than the tokenizer's, as Qwen's is (its
embedding rows past the tokenizer are padding); sampled ids past the tokenizer decode to nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

QWEN_VOCAB = 151936
GEOMETRIES = {
    # the --cpu rehearsal: the same script and trainers on a model a CPU steps in a second
    "tiny": {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 2048, "tie_word_embeddings": True},
    "qwen2.5-0.5b": {"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": QWEN_VOCAB,
                     "tie_word_embeddings": True, "rope_theta": 1000000.0},
    "qwen3-1.7b": {"model_type": "qwen3", "num_hidden_layers": 28, "hidden_size": 2048, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144, "vocab_size": QWEN_VOCAB,
                   "tie_word_embeddings": True, "rope_theta": 1000000.0},
}
TOKENIZER_VOCAB = 2048


def write_model(directory: Path, geometry: str, device=None) -> dict:
    """Write ``config.json``, random bf16 weights and the tokenizer; the weights are drawn on ``device`` (the
    backend's: a CPU takes tens of seconds to draw 2B normals). Returns what was written."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    from engine.demo_model import build_tokenizer

    logging.disable_progress_bar()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(TOKENIZER_VOCAB)
    tokenizer.save_pretrained(directory)
    shape = dict(GEOMETRIES[geometry])
    config = AutoConfig.for_model(shape.pop("model_type"), **shape, max_position_embeddings=4096,
                                  bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                  pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)  # no dtype argument: older transformers
    model.save_pretrained(directory, safe_serialization=True)
    parameters = sum(p.numel() for p in model.parameters())
    return {"geometry": geometry, "parameters": parameters, **GEOMETRIES[geometry]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), required=True)
    args = parser.parse_args(argv)
    import accel_backends

    started = time.perf_counter()
    written = write_model(args.directory, args.geometry, accel_backends.get_backend().device())
    print(f"geometry: {args.geometry}: {written['parameters'] / 1e9:.3f}B parameters written to {args.directory} "
          f"in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
