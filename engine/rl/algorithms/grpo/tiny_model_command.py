"""``accel-grpo make-tiny-model DIR``: a tiny random Qwen2.5-Instruct-like model directory, to try the real-model
path without a download."""

from __future__ import annotations

import argparse


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="accel-grpo make-tiny-model",
                                     description="Write a tiny random Qwen2.5-Instruct-like model directory (BPE "
                                                 "tokenizer, chat template, generation config): the real-model path "
                                                 "without a download.")
    parser.add_argument("directory")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary (with 3 special tokens)")
    parser.add_argument("--eos-bias", type=float, default=0.5,
                        help="how far the EOS logits stand above the others (default 0.5: responses of about 30 "
                             "tokens; 0.33 with --hidden-size 128 --layers 4 --single-eos: lengths spread from 1 to "
                             "128, mean about 70; 0: no boost)")
    parser.add_argument("--single-eos", action="store_true",
                        help="<|im_end|> as the only EOS id (compare with TRL, which stops at the tokenizer's EOS)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("hidden_size", "layers", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    from ....demo_model import make_tiny_model

    path = make_tiny_model(args.directory, hidden_size=args.hidden_size, layers=args.layers,
                           vocab_size=args.vocab_size, eos_bias=args.eos_bias, single_eos=args.single_eos,
                           seed=args.seed)
    print(f"accel-grpo: wrote {path}; try: accel-grpo model.path={path} data.path=train.parquet "
          "data.reward=my_rewards:compute_score")
    return 0
