"""Compare an exported model directory with the checkpoint it came from, as the engine runs it.

    PYTHONPATH=.:tests python tests/scripts/export_logits.py RUN_DIR EXPORTED_DIR [--nproc 2] [--adapter]

The checkpoint (the run's newest complete one) is loaded into a sharded FSDPEngine on ``--nproc`` CPU ranks, as
``--resume`` would, and its logits on a few prompts are compared with those of the exported directory loaded by
transformers (``AutoModelForCausalLM``, or the base model plus ``PeftModel`` with ``--adapter``) and its tokenizer
(``AutoTokenizer``). Prints the largest absolute difference of the logits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from distributed import run_ranks

PROMPTS = ["a x2:", "h x3:", "c x1:"]


def _engine_logits(rank, run_dir, prompts):
    import torch

    from engine import FSDPEngine
    from engine.checkpoint import latest_complete
    from engine.rl.algorithms.grpo.config import GRPOConfig, engine_config
    from engine.rl.model import build_model

    config = GRPOConfig.from_dict(json.loads((Path(run_dir) / "config.json").read_text()))
    tokenizer, source = build_model(config.model)
    engine = FSDPEngine(source, engine_config(config, 2))
    engine.load_checkpoint(latest_complete(Path(run_dir) / "checkpoints"))
    ids = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with engine.eval_mode(), torch.no_grad():
        logits = engine.module(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"]).logits
    return logits.float(), ids["input_ids"], ids["attention_mask"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("exported")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--adapter", action="store_true")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    want, ids, mask = run_ranks(_engine_logits, args.run_dir, PROMPTS, world_size=args.nproc)[0]
    config = json.loads((Path(args.run_dir) / "config.json").read_text())
    if config["model"]["path"] == "builtin:tiny-char":  # AutoTokenizer gives every qwen2 model Qwen2Tokenizer
        from transformers import PreTrainedTokenizerFast as AutoTokenizer  # noqa: N814
    tokenizer = AutoTokenizer.from_pretrained(args.exported)
    assert tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"] == ids[0][mask[0].bool()].tolist()
    if args.adapter:
        from peft import PeftConfig, PeftModel

        base = PeftConfig.from_pretrained(args.exported).base_model_name_or_path
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), args.exported)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.exported)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits.float()
    print(f"dtype {next(model.parameters()).dtype}; logits {tuple(got.shape)}; max abs difference "
          f"{(got - want).abs().max().item():.3g}; largest logit {want.abs().max().item():.3g}")


if __name__ == "__main__":
    sys.exit(main())
