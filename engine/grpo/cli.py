"""``accel-grpo``: GRPO post-training on the shared engine. No arguments: the CPU demo (2 processes).

    accel-grpo                                   # preset cpu-demo
    accel-grpo --preset h100 model.path=/models/Qwen2.5-0.5B-Instruct data.path=/data/gsm8k/train.jsonl
    accel-grpo --config my.yaml train.steps=100 rollout.n=16
    accel-grpo --resume run.name=cpu-demo-20261129-101500
    accel-grpo make-tiny-model /tmp/tiny-qwen       # a tiny random Qwen2.5-Instruct-like model directory
    accel-grpo export runs/NAME /models/NAME-hf     # a checkpoint as a Hugging Face model directory
    accel-grpo eval runs/NAME data.val_path=test.jsonl   # validation alone, of a checkpoint or a model directory

The backend comes from ACCEL_BACKEND or auto-detection. With --nproc N (default: the preset's) it starts N
workers and watches them (engine/runtime/launcher.py); under torchrun it joins that job instead (multi-node: torchrun).
A failing rank ends the job with exit status 1; Ctrl-C / SIGTERM with 130 / 143 (run.save_on_interrupt=true
checkpoints the current step first). Either way the last lines say how to resume.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..runs.cli import input_error, is_rank0, parse_run_args, print_outputs, run_subcommand, run_workers
from ..runs.run_dir import run_dir as run_dir_of
from ..runs.workers import world_size
from .config import PRESETS, load_config, require_valid, resolved
from .report import read_metrics


def _run_dir(config, resume: bool) -> Path:
    return run_dir_of(config, resume)


def worker(config_dict: dict, run_dir: str, resume: bool) -> dict:
    """What every rank runs."""
    from .config import GRPOConfig
    from .trainer import GRPOTrainer

    trainer = GRPOTrainer(GRPOConfig.from_dict(config_dict), Path(run_dir), resume)
    return trainer.train()


def check_inputs(config, verbose: bool = True) -> None:
    """Load what the workers will load (rewards, tokenizer, every data row) so that bad input fails here."""
    from ..runs.loggers import require_loggers
    from .model import build_model
    from .rewards import load_rewards
    from .tasks import build_tasks, data_spec, needs_answers

    spec = data_spec(config)
    rewards = load_rewards(list(spec.rewards), spec.reward_style)
    require_loggers(config.run.loggers)
    if spec.path:
        tokenizer, _ = build_model(config.model)
        build_tasks(spec, tokenizer, needs_answers(rewards), verbose=verbose and is_rank0())


def make_tiny_model_main(argv: list[str]) -> int:
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
    from ..demo_model import make_tiny_model

    path = make_tiny_model(args.directory, hidden_size=args.hidden_size, layers=args.layers,
                           vocab_size=args.vocab_size, eos_bias=args.eos_bias, single_eos=args.single_eos,
                           seed=args.seed)
    print(f"accel-grpo: wrote {path}; try: accel-grpo model.path={path} data.path=train.parquet "
          "data.reward=my_rewards:compute_score")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    status = run_subcommand(argv, __package__, {"make-tiny-model": make_tiny_model_main, "export": ".export",
                                                "eval": ".evaluate"})
    if status is not None:
        return status
    args = parse_run_args(argv, "accel-grpo", __doc__, PRESETS,
                          sections="model, data, rollout, algorithm, train, run, engine",
                          print_config="check the config, print it resolved (engine defaults, derived sizes) and exit",
                          example="train.steps=10 rollout.n=4")

    import accel_backends

    try:
        config, notices = load_config(args.preset, args.config, args.overrides)
        for notice in notices:
            if is_rank0():
                print(f"accel-grpo: notice: {notice}", file=sys.stderr)
        if args.nproc is not None:
            config.nproc = args.nproc  # --nproc beats nproc from anywhere else, and config.json records it
        workers = world_size(config, args.nproc)
        require_valid(config, workers)
        check_inputs(config, verbose=not args.print_config)  # the printed config stays valid JSON
        if args.print_config:
            print(json.dumps(resolved(config, workers), indent=2))
            return 0
        backend = accel_backends.get_backend()  # an unknown or unusable backend stops us here
        run_dir = _run_dir(config, args.resume)
        if args.resume:
            from .trainer import latest_checkpoint

            if latest_checkpoint(run_dir) is None:
                raise FileNotFoundError(f"--resume: no checkpoint in {run_dir / 'checkpoints'}")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(resolved(config, workers), indent=2))
    except (ValueError, FileNotFoundError, accel_backends.AccelBackendError) as exc:
        return input_error("accel-grpo", exc)

    started = time.perf_counter()
    status = run_workers("accel-grpo", worker, config, workers, run_dir, args.resume, backend=backend,
                         steps=config.train.steps)
    if status is not None:
        return status
    elapsed = time.perf_counter() - started
    if not is_rank0():
        return 0
    rewards = [row["reward_mean"] for row in read_metrics(run_dir / "metrics.jsonl") if "reward_mean" in row]
    if rewards:
        first, final = rewards[:10], rewards[-10:]
        print(f"accel-grpo: done in {elapsed:.0f} s; reward mean over the first {len(first)} steps "
              f"{sum(first) / len(first):.3f}, over the last {len(final)} steps {sum(final) / len(final):.3f}")
    print_outputs(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
