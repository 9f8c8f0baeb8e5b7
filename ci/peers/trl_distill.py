"""TRL's on-policy distillation trainer (``trl.DistillationTrainer``, TRL 1.16: always on-policy, ``beta=1.0`` the
reverse KL) on the work ``ci/peers/distill_compare.py`` gives it: one process, the same student and teacher
directories and prompts, the same sequences per optimizer step and response limit. Writes the wall time of every
optimizer step (between two ``on_step_end`` callbacks) and each step's mean completion length to ``--out``."""

from __future__ import annotations

import argparse
import json

from step_clock import step_clock


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--student", required=True)
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--per-device", type=int, default=16)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DistillationConfig, DistillationTrainer

    rows = [json.loads(line) for line in open(args.data)]
    tokenizer = AutoTokenizer.from_pretrained(args.student)
    student = AutoModelForCausalLM.from_pretrained(args.student, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32)
    clock, step_seconds = step_clock()
    config = DistillationConfig(
        output_dir=args.out + ".trainer", per_device_train_batch_size=args.per_device,
        gradient_accumulation_steps=args.accumulation, max_steps=args.steps, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, max_completion_length=args.new_tokens, temperature=1.0,
        beta=1.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0,
        disable_tqdm=True, bf16=False, gradient_checkpointing=False)  # fp32, no recomputation: as ours
    trainer = DistillationTrainer(model=student, teacher_model=teacher, args=config,
                                  train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                                  callbacks=[clock])
    trainer.train()
    steps = step_seconds()
    lengths = [entry["completions/mean_length"] for entry in trainer.state.log_history
               if "completions/mean_length" in entry]
    with open(args.out, "w") as handle:
        json.dump({"steps": steps, "response_lengths": lengths}, handle)


if __name__ == "__main__":
    main()
