"""TRL's DPOTrainer (the sigmoid loss against a frozen reference copy, which TRL builds from the model's directory)
on the work ``ci/peers/preference_compare.py`` gives it: one process, the same model directory and JSONL file of
conversational prompt/chosen/rejected pairs, the same pairs per optimizer step. Writes the wall time of every
optimizer step (between two ``on_step_end`` callbacks) and the logged losses to ``--out``; ``trl_rm.py`` shares
the options and the record."""

from __future__ import annotations

import argparse
import json

from step_clock import step_clock


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--per-device", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-5)
    return parser.parse_args()


def settings(args) -> dict:
    """The ``TrainingArguments`` both TRL trainers get here."""
    return dict(output_dir=args.out + ".trainer", per_device_train_batch_size=args.per_device,
                gradient_accumulation_steps=args.accumulation, max_steps=args.steps, learning_rate=args.lr,
                lr_scheduler_type="constant", warmup_steps=0, max_length=args.max_length, logging_steps=1,
                save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0, disable_tqdm=True,
                # the same arithmetic as ours: fp32 compute (TRL's default bf16 autocast is slow on a CPU) and no
                # activation recomputation (TRL's default turns it on)
                bf16=False, gradient_checkpointing=False)


def train_and_record(make_trainer, args) -> None:
    """Train ``make_trainer(train_dataset, callbacks)``, then write its step times and losses to ``args.out``."""
    from datasets import Dataset

    rows = [json.loads(line) for line in open(args.data)]
    clock, step_seconds = step_clock()
    trainer = make_trainer(Dataset.from_list(rows), [clock])
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    with open(args.out, "w") as handle:
        json.dump({"steps": step_seconds(), "losses": losses}, handle)


def main() -> None:
    args = parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    config = DPOConfig(**settings(args), beta=0.1, loss_type=["sigmoid"], precompute_ref_log_probs=False)
    train_and_record(lambda data, callbacks: DPOTrainer(model=model, args=config, train_dataset=data,
                                                        processing_class=tokenizer, callbacks=callbacks), args)


if __name__ == "__main__":
    main()
