"""TRL's GRPOTrainer on the cpu-demo work (or on a model directory, ``--model-dir``): same model, task, reward and
batch geometry as ``accel-grpo``.

Run by ``ci/peers/compare.py`` in TRL's own virtual environment (``ci/bench-peers.sh`` makes it), with this
repository on ``PYTHONPATH`` only for the task, reward, tokenizer and model config, so both sides learn the same
thing from the same initial weights. Writes one JSON line per optimizer step (seconds, reward mean) to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time

STARTED = time.perf_counter()


def build_dataset(prompts: int, seed: int):
    import torch
    from datasets import Dataset

    from engine.rl.prompts import EchoTask

    samples = EchoTask().sample(prompts, torch.Generator().manual_seed(seed))
    return Dataset.from_dict({"prompt": [s.prompt for s in samples], "answer": [s.answer for s in samples]})


def echo_rewards(prompts, completions, answer, **_):
    from engine.rl.prompts import echo_reward

    return [echo_reward(p, c, a) for p, c, a in zip(prompts, completions, answer, strict=True)]


def save_demo_model(directory: str, hidden: int, layers: int, seed: int):
    """The cpu-demo model and tokenizer, built exactly as accel-grpo builds them (same config, same seed)."""
    import torch

    from engine.rl.algorithms.grpo.config import GRPOConfig
    from engine.rl.model import build_model

    config = GRPOConfig()
    config.model.hidden_size, config.model.layers = hidden, layers
    tokenizer, factory = build_model(config.model)
    torch.manual_seed(seed)
    factory().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--kl-coef", type=float, default=0.001)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", help="a model directory (the long case) instead of cpu-demo's model")
    args = parser.parse_args()

    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    completions = args.prompts_per_step * args.n
    wanted = dict(
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=completions // args.micro_batch,
        num_generations=args.n, max_completion_length=args.new_tokens, learning_rate=args.lr, beta=args.kl_coef,
        num_iterations=1, epsilon=0.2, loss_type="dapo", scale_rewards="group", temperature=1.0, top_p=1.0,
        top_k=0, max_steps=args.steps, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        weight_decay=0.0, gradient_checkpointing=False, logging_steps=1, report_to="none", save_strategy="no",
        use_cpu=True, bf16=False, seed=args.seed, disable_dropout=True, log_completions=False, dataloader_num_workers=0)
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    dropped = sorted(k for k in wanted if k not in known)

    class StepLog(TrainerCallback):
        """Seconds between optimizer steps; the step's reward arrives in the log right after ``on_step_end``."""

        def __init__(self, out):
            self.out, self.last, self.pending = out, None, None

        def on_train_begin(self, *a, **k):
            self.last = time.perf_counter()
            self.out.write(json.dumps({"event": "start", "startup_s": self.last - STARTED,
                                       "dropped_settings": dropped}) + "\n")

        def on_step_end(self, args_, state, control, **k):
            now = time.perf_counter()
            self.pending, self.last = {"step": state.global_step, "step_time_s": now - self.last}, now

        def on_log(self, args_, state, control, logs=None, **k):
            if self.pending and logs and "reward" in logs:
                lengths = {"response_length": logs.get("completions/mean_length")}
                self.out.write(json.dumps({**self.pending, "reward_mean": logs["reward"], **lengths}) + "\n")
                self.out.flush()
                self.pending = None

    with tempfile.TemporaryDirectory() as scratch, open(args.out, "w") as out:
        if args.model_dir:
            from transformers import AutoTokenizer

            model_dir = args.model_dir
            tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        else:
            model_dir = scratch
            tokenizer = save_demo_model(model_dir, args.hidden, args.layers, args.seed)
        config = GRPOConfig(output_dir=f"{scratch}/trl-out", **{k: v for k, v in wanted.items() if k in known})
        trainer = GRPOTrainer(model=model_dir, reward_funcs=echo_rewards, args=config,
                              train_dataset=build_dataset(args.steps * args.prompts_per_step, args.seed),
                              processing_class=tokenizer, callbacks=[StepLog(out)])
        trainer.train()
        out.write(json.dumps({"event": "end", "wall_s": time.perf_counter() - STARTED}) + "\n")


if __name__ == "__main__":
    main()
