"""``accel-sft``: supervised fine-tuning on the shared engine. No arguments: the CPU demo (2 processes, a tiny model
learns a synthetic chat task in about a minute).

    accel-sft                                     # preset cpu-demo
    accel-sft --preset h100 model.path=/models/Qwen2.5-0.5B data.path=/data/chat.jsonl
    accel-sft model.path=DIR data.path=train.parquet data.format=messages train.batch_size=64
    accel-sft --resume run.name=cpu-demo-20261201-101500
    accel-sft export runs/NAME /models/NAME-hf    # a checkpoint as a Hugging Face model directory (or --lora adapter)
    accel-sft eval runs/NAME data.val_path=val.jsonl   # loss and token accuracy of a checkpoint or model directory

Options, runs, checkpoints, loggers and exit statuses are those of accel-grpo (docs/sft.md).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..train.cli import input_error, is_rank0, parse_run_args, print_outputs, run_subcommand, run_workers
from ..train.config import require_valid
from ..train.report import read_metrics
from ..train.run_dir import run_dir
from ..train.workers import world_size
from .config import PRESETS, build_config, check, resolved

TOOL = "accel-sft"


def worker(config_dict: dict, run_directory: str, resume: bool) -> dict:
    """What every rank runs."""
    from .config import SFTConfig
    from .trainer import SFTTrainer

    return SFTTrainer(SFTConfig.from_dict(config_dict), Path(run_directory), resume).train()


def check_inputs(config):
    """Read, check and tokenize every row here, before any worker starts: bad input fails with one line."""
    from ..train.loggers import require_loggers
    from .dataset import build_data
    from .model import load_tokenizer

    require_loggers(config.run.loggers)
    return build_data(config.data, config.train.loss_on, load_tokenizer(config.model.path), config.train.seed)


def derived(config, data, workers: int) -> dict:
    from .batches import schedule

    t = config.train
    steps = len(schedule([len(item.ids) for item in data.train], batch_size=t.batch_size,
                         batch_tokens=t.batch_tokens, epochs=t.epochs, steps=t.steps, seed=t.seed))
    return {"world_size": workers, "total_steps": steps, "format": data.format, "loss_on": data.loss_on,
            "train_examples": len(data.train), "val_examples": len(data.val)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    status = run_subcommand(argv, __package__, {"export": ".export", "eval": ".evaluate"})
    if status is not None:
        return status
    args = parse_run_args(argv, TOOL, __doc__, PRESETS, sections="model, data, train, run, engine",
                          print_config="check the config and the data, print the config resolved and exit",
                          example="train.batch_size=32")
    import accel_backends

    from .model import resolve_model_path

    try:
        config = build_config(args.preset, args.config, args.overrides)
        if args.nproc is not None:
            config.nproc = args.nproc
        workers = world_size(config, args.nproc)
        require_valid(check(config, workers))
        resolve_model_path(config)
        data = check_inputs(config)
        figures = derived(config, data, workers)
        if args.print_config:
            print(json.dumps(resolved(config, figures), indent=2))
            return 0
        if is_rank0():
            print(f"{TOOL}: data: {data.summary()}" + (" (data.format=auto chose it)" if config.data.format == "auto"
                                                         and config.data.path else ""), file=sys.stderr)
        backend = accel_backends.get_backend()
        directory = run_dir(config, args.resume)
        if args.resume and checkpoint_missing(directory):
            raise FileNotFoundError(f"--resume: no checkpoint in {directory / 'checkpoints'}")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(resolved(config, figures), indent=2))
    except (ValueError, FileNotFoundError, accel_backends.AccelBackendError) as exc:
        return input_error(TOOL, exc)
    started = time.perf_counter()
    status = run_workers(TOOL, worker, config, workers, directory, args.resume, backend=backend,
                         steps=figures["total_steps"])
    if status is not None:
        return status
    if not is_rank0():
        return 0
    rows = [row for row in read_metrics(directory / "metrics.jsonl") if "loss" in row]
    if rows:
        first, final = rows[:5], rows[-5:]
        line = (f"{TOOL}: done in {time.perf_counter() - started:.0f} s; loss over the first {len(first)} steps "
                f"{sum(r['loss'] for r in first) / len(first):.3f}, over the last {len(final)} "
                f"{sum(r['loss'] for r in final) / len(final):.3f}")
        vals = [row for row in rows if "val/loss" in row]
        if vals:
            line += (f"; validation loss {vals[-1]['val/loss']:.3f}, token accuracy "
                     f"{vals[-1]['val/mean_token_accuracy']:.3f}")
        print(line)
    print_outputs(directory)
    return 0


def checkpoint_missing(directory: Path) -> bool:
    from .. import checkpoint

    return checkpoint.latest_complete(directory / "checkpoints") is None


if __name__ == "__main__":
    sys.exit(main())
