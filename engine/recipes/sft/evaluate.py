"""``accel-sft eval RUN_DIR|CHECKPOINT|MODEL_DIR key=value...``: loss and token accuracy on a validation set, summed
over its supervised tokens on every rank (the same figures as a run's ``val/loss`` and ``val/mean_token_accuracy``).

The validation set is ``data.val_path``, else the run's own (its ``data.val_path`` or ``data.val_fraction``, or the
demo task's held-out share). A run
is evaluated at its newest complete checkpoint (or ``--step N``); a model directory as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ...train.config import dist_timeout_s
from ...train.eval_config import eval_config
from ...train.export import ExportError
from ...train.workers import parse_nproc, world_size
from .config import check


def evaluation_set(config, tokenizer):
    """The tokenized examples to evaluate: ``data.val_path`` alone, or the run's held-out share."""
    import copy

    from .dataset import build_data

    d = config.data
    if d.val_path:
        alone = copy.deepcopy(d)
        alone.path, alone.val_path, alone.val_fraction = d.val_path, None, 0.0
        return build_data(alone, config.train.loss_on, tokenizer, config.train.seed).train
    return build_data(d, config.train.loss_on, tokenizer, config.train.seed).val


def worker(config_dict: dict, weights: str | None) -> dict:
    import torch

    import accel_backends

    from ... import FSDPEngine
    from ...rl.offline.model_files import load_tokenizer
    from ...rl.offline.run_config import engine_config
    from .batches import rank_micro_batches
    from .config import SFTConfig
    from .trainer import token_loss

    config = SFTConfig.from_dict(config_dict)
    backend = accel_backends.get_backend()
    backend.init_distributed(timeout=dist_timeout_s(config))
    tokenizer = load_tokenizer(config.model.path)
    items = evaluation_set(config, tokenizer)
    engine = FSDPEngine(config.model.path, engine_config(config, 1), backend)
    if weights:
        engine.load_checkpoint(weights)
    packed = config.train.padding_free and engine.packed_input_supported()
    sp = engine.sequence_parallel  # a run trained with sequence parallelism evaluates on slices, as it validated
    micro, _ = rank_micro_batches(items, sp.data_parallel_rank, sp.data_parallel_size, packed=packed,
                                  micro_batch_tokens=config.train.micro_batch_tokens,
                                  micro_batch_size=config.train.micro_batch_size)
    device = backend.device()
    with engine.eval_mode(), torch.no_grad():
        result = engine.forward_backward_batch(micro, lambda module, m: token_loss(module, m, device, sp),
                                               forward_only=True)
    return {"val/loss": result["loss"], "val/mean_token_accuracy": result["mean_token_accuracy"],
            "val/num_tokens": result["weight"], "examples": len(items)}


def configure(source: str, step: int | None, overrides: list[str]):
    """``(config, checkpoint or None)`` for a run, a checkpoint or a model directory, overrides applied (the
    frame's ``eval_config``: a model directory gets the library defaults)."""
    from ...train.registry import get_recipe

    config, target, _ = eval_config(get_recipe("sft"), source, step=step, overrides=overrides)
    if config.data.val_path:
        config.data.val_fraction = 0.0
    if "model" in target:
        config.data.val_fraction = 0.0
        if not config.data.val_path:
            raise ExportError("evaluating a model directory needs data.val_path=FILE")
        return config, None
    if config.data.path and not (config.data.val_path or config.data.val_fraction):  # the demo task holds one out
        raise ExportError(f"run {target['run']} has no validation set: pass data.val_path=FILE")
    return config, target["checkpoint"]


HELP = """Loss and token accuracy of a model on a validation set, summed over its supervised tokens: the same
figures as a run's val/loss and val/mean_token_accuracy.

The validation set is data.val_path, else the run's own. A run is evaluated at its newest complete checkpoint (or
--step N); a model directory as it is, with the library defaults.

example:
  accel-sft eval runs/NAME data.val_path=val.jsonl --json val.json"""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="accel-sft eval", description=HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="RUN_DIR|CHECKPOINT|MODEL_DIR")
    parser.add_argument("--step", type=int, help="the checkpoint of this step (with a run directory)")
    parser.add_argument("--nproc", type=parse_nproc, help="worker processes (default: the config's)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to this file")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(argv)
    from ...rl.offline.model_files import load_tokenizer
    from ...runtime import Interrupted, WorkerFailed, run
    from .dataset import build_data  # noqa: F401  (imported here: a broken install fails before the workers)

    try:
        config, weights = configure(args.source, args.step, args.overrides)
        workers = world_size(config, args.nproc)
        problems = check(config, workers)
        if problems:
            raise ValueError("invalid configuration: " + "; ".join(problems))
        examples = evaluation_set(config, load_tokenizer(config.model.path))  # bad rows fail here
        if not examples:
            raise ValueError("the validation set is empty")
    except (ValueError, FileNotFoundError) as exc:
        print(f"accel-sft eval: error: {exc}", file=sys.stderr)
        return 2
    try:
        figures = run(worker, workers, config.to_dict(), weights)  # rank 0's
    except (WorkerFailed, Interrupted) as exc:
        print(f"accel-sft eval: error: {exc}", file=sys.stderr)
        return 1
    text = json.dumps({"source": args.source, "checkpoint": weights, **figures}, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0
