"""``accel-grpo --help``."""

HELP = """GRPO post-training of a causal language model on prompts with a reward (GSM8K-style data and your own
reward functions; multi-turn rollouts with tools).

With no arguments: the CPU demo (2 processes, a tiny built-in model learns a synthetic task). Given a model or data
of your own, the library defaults apply (up to 512 new tokens per response, the GSM8K answer check as the reward
unless data.reward names yours) unless you name a preset with --preset.

examples:
  accel-grpo                                      # the CPU demo
  accel-grpo model.path=/models/Qwen2.5-0.5B-Instruct data.path=/data/gsm8k/train.parquet
  accel-grpo --preset h100 model.path=/models/Qwen2.5-0.5B-Instruct data.path=/data/gsm8k/train.jsonl
  accel-grpo --config my.yaml train.steps=100 rollout.n=16
  accel-grpo --resume run.name=grpo-cpu-demo-20261129-101500
  accel-grpo make-tiny-model /tmp/tiny-qwen       # a tiny random model directory, to try the real-model path
  accel-grpo export runs/NAME /models/NAME-hf     # a checkpoint as a Hugging Face model directory
  accel-grpo eval runs/NAME data.val_path=test.jsonl

The device comes from ACCEL_BACKEND or is detected. --nproc N starts N worker processes on this machine; under
torchrun the command joins that job instead (several machines). A failing worker ends the run with exit status 1.
Ctrl-C or SIGTERM finishes the current step, saves it and stops (exit status 130 / 143); the last line says how to
resume. Options and metrics: docs/grpo.md.
"""
