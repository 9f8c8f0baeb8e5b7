"""TRL's SFTTrainer on the work ``ci/peers/sft_compare.py`` gives it: one process, the same model directory and
JSONL file (conversational prompt-completion rows: TRL trains the completion), the same sequences per optimizer step.
Writes the wall time of every optimizer step (between two ``on_step_end`` callbacks) to ``--out``."""

from __future__ import annotations

import argparse
import json

from step_clock import step_clock


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--per-device", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--packing", action="store_true")
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = [json.loads(line) for line in open(args.data)]
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    clock, step_seconds = step_clock()
    config = SFTConfig(output_dir=args.out + ".trainer", per_device_train_batch_size=args.per_device,
                       gradient_accumulation_steps=args.accumulation, max_steps=args.steps, learning_rate=args.lr,
                       lr_scheduler_type="constant", warmup_steps=0, max_length=args.max_length,
                       packing=args.packing, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                       dataloader_num_workers=0, seed=0, disable_tqdm=True,
                       # the same arithmetic as accel-sft's: fp32 compute (TRL's default bf16 autocast is slow on a
                       # CPU) and no activation recomputation (TRL's default turns it on)
                       bf16=False, gradient_checkpointing=False)
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         callbacks=[clock])
    trainer.train()
    steps = step_seconds()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    with open(args.out, "w") as handle:
        json.dump({"steps": steps, "losses": losses}, handle)


if __name__ == "__main__":
    main()
