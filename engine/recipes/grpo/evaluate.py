"""``accel-grpo eval MODEL_DIR|RUN_DIR key=value...``: a run's validation on its own, for a base model or a checkpoint.

The same code as in-run validation (``validation.validate``: ``rollout.val_n`` samples per held-out prompt, greedy
when ``rollout.val_temperature`` is 0, the run's reward functions, ``val/reward_mean`` and ``val/accuracy``) on
``nproc`` workers. A run directory is evaluated at its newest complete checkpoint (or ``--step``), with the run's
own configuration under the overrides; its checkpoint is first exported to a temporary model directory inside the
output directory. A model directory is evaluated with the library defaults (or ``--preset``) and ``model.path`` set
to it; the prompt limit (and vLLM's context) is sized from the validation data read. Rank 0 writes
``results.json`` and ``samples.jsonl`` (every scored response).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ... import checkpoint
from ...rl.model import BUILTIN_MODEL, check_model_dir
from ...train.config import dist_timeout_s
from ...train.eval_config import eval_config
from ...train.workers import parse_nproc
from ...train.workers import world_size as worker_count
from .config import GRPOConfig, engine_config, prompts_per_rank
from .export import ExportError, export


def problems(config: GRPOConfig, check_model: bool = True) -> list[str]:
    """What would stop an evaluation, as sentences (the training-only rules of ``config.check`` do not apply)."""
    found = []
    d, r = config.data, config.rollout
    if not (d.val_path or (d.path and d.val_fraction)):
        found.append("no validation data: give data.val_path=FILE (or data.path=FILE with data.val_fraction=F)")
    for key, path in (("data.path", d.path), ("data.val_path", d.val_path)):
        if path and not Path(path).exists():
            found.append(f"{key} {path} does not exist")
    if check_model and config.model.path != BUILTIN_MODEL:
        found += check_model_dir(config.model.path)
    if r.val_n < 1 or r.val_temperature < 0 or r.max_new_tokens < 1 or not 0 < r.top_p <= 1 or r.top_k < 0:
        found.append("rollout.val_n and rollout.max_new_tokens must be >= 1, rollout.val_temperature and "
                     "rollout.top_k >= 0, rollout.top_p in (0, 1]")
    if d.chat_template not in ("auto", "none"):
        found.append(f"data.chat_template must be auto or none, got {d.chat_template!r}")
    return found


def worker(config_dict: dict, out_dir: str, weights: str | None) -> dict:
    """What every rank runs: build the model frozen, validate, and (rank 0) write the samples.

    ``weights``: a model directory whose weights replace ``model.path``'s (a run's exported checkpoint); the
    tokenizer stays the run's own.
    """
    import torch.distributed as dist
    from transformers.utils import logging

    import accel_backends

    from ... import FSDPEngine
    from ...rl.model import build_model
    from ...rl.prompts import data_spec, needs_answers, validation_set
    from ...rl.rewards import load_rewards
    from ...rl.validation import validate
    from ...rollout import (
        RolloutContext,
        SingleTurnRollout,
        create_rollout_engine,
        eos_token_ids,
        sampling_configs,
        sync_weights,
    )
    from .config import max_sequence_tokens

    logging.disable_progress_bar()  # a "Loading weights" bar per rank is noise
    config = GRPOConfig.from_dict(config_dict)
    backend = accel_backends.get_backend()
    world_size = backend.init_distributed(timeout=dist_timeout_s(config)).world_size
    tokenizer, source = build_model(config.model)
    spec = data_spec(config)  # the config enters data loading here, once: spec -> rewards -> prompts
    rewards = load_rewards(list(spec.rewards), spec.reward_style)
    samples = validation_set(spec, tokenizer, needs_answers(rewards), verbose=False)
    # An exported checkpoint has its LoRA merged: the model is evaluated as it is. Evaluation only generates, on
    # whole sequences: a run trained with sequence parallelism is evaluated without it, on any number of processes.
    options = dataclasses.replace(engine_config(config, world_size, frozen=True), lora_rank=0,
                                  sequence_parallel_size=1)
    engine = FSDPEngine(weights or source, options, backend)
    # The same rollout engine and sampling settings as in-run validation (rollout.engine, rollout.val_*).
    _, val_sampling = sampling_configs(config.rollout, eos_token_ids(engine.module, tokenizer))
    rollout_engine = create_rollout_engine(config.rollout.engine, RolloutContext(
        engine, tokenizer, weights or source, config.rollout, max_sequence_tokens(config)))
    sync_weights(engine, rollout_engine)  # an engine holding its own copy starts from the evaluated weights
    records: list[dict] = []
    started = time.perf_counter()
    # Single-turn, as before the rollout layer moved: eval loads no tools or environment.
    metrics = validate(engine, rollout_engine, SingleTurnRollout(tokenizer), samples, rewards, val_sampling,
                       batch_prompts=max(1, prompts_per_rank(config, world_size)), records=records)
    gathered = [None] * world_size if engine.rank == 0 else None
    dist.gather_object(records, gathered, dst=0)
    if engine.rank != 0:
        return metrics
    responses = sorted((r for part in gathered for r in part), key=lambda r: r["index"])
    out = Path(out_dir)
    with (out / "samples.jsonl").open("w") as handle:
        for record in responses:
            handle.write(json.dumps(record) + "\n")
    results = {**metrics, "prompts": len(samples), "responses": len(responses),
               "samples_per_prompt": config.rollout.val_n, "temperature": config.rollout.val_temperature,
               "max_new_tokens": config.rollout.max_new_tokens, "world_size": world_size, "backend": backend.name,
               "time_s": time.perf_counter() - started}
    return results


def configure(args) -> tuple[GRPOConfig, dict]:
    """The configuration to evaluate with (the frame's ``eval_config``: the run's, or for a model directory the
    library defaults or ``--preset``; then ``--config``, then the overrides) and what is evaluated."""
    from ...train.registry import get_recipe

    config, target, notices = eval_config(get_recipe("grpo"), args.source, step=args.step, preset=args.preset,
                                          config_file=args.config, overrides=args.overrides)
    for notice in notices:
        if os.environ.get("RANK", "0") == "0":
            print(f"accel-grpo eval: notice: {notice}", file=sys.stderr)
    return config, target


def load_inputs(config: GRPOConfig) -> int:
    """Load what the workers will (rewards, tokenizer, every held-out row) so that bad input fails here; return the
    number of held-out prompts. Without ``data.max_prompt_tokens`` it becomes the longest held-out prompt, so that
    the rollout engine (vLLM's context) is sized for the data evaluated."""
    from ...rl.model import build_model
    from ...rl.prompts import data_spec, needs_answers, validation_set
    from ...rl.rewards import load_rewards

    spec = data_spec(config)
    rewards = load_rewards(list(spec.rewards), spec.reward_style)
    tokenizer, _ = build_model(config.model)
    samples = validation_set(spec, tokenizer, needs_answers(rewards), verbose=True)
    if not samples:
        raise ValueError("the validation set is empty")
    if config.data.max_prompt_tokens is None:
        config.data.max_prompt_tokens = max(len(tokenizer(s.prompt, add_special_tokens=False)["input_ids"])
                                            for s in samples)
    return len(samples)


def default_output(config: GRPOConfig, target: dict) -> Path:
    if "run" in target:
        return Path(target["run"]) / "eval" / f"step_{target['step']:06d}"
    return Path(config.run.output_dir) / f"eval-{Path(target['model']).resolve().name}"


HELP = """Validate a model on its own: a base model, an exported model, or a run's checkpoint, with the same
sampling, rewards and metrics (val/reward_mean, val/accuracy) as validation during training.

A run directory is evaluated at its newest complete checkpoint (or --step N) with the run's own settings under
your key=value overrides; a model directory with the library defaults (or --preset), the prompt limit sized from
the validation data. Writes results.json and samples.jsonl (every scored response) to --out.

example:
  accel-grpo eval runs/NAME data.val_path=test.jsonl
  accel-grpo eval /models/Qwen2.5-0.5B-Instruct data.val_path=test.parquet rollout.engine=vllm"""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="accel-grpo eval", description=HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="MODEL_DIR|RUN_DIR",
                        help="a Hugging Face model directory, a run directory or one of its checkpoints/step_N")
    parser.add_argument("--step", type=int, help="a run's checkpoint of this step (default: the newest complete)")
    parser.add_argument("--preset", help="for a model directory: the preset whose settings apply (default: the "
                                          "library defaults)")
    parser.add_argument("--config", help="a YAML file of sections, applied before the overrides")
    parser.add_argument("--nproc", type=parse_nproc, help="worker processes (default: the config's nproc)")
    parser.add_argument("--out", help="output directory (default: <run>/eval/step_<N> for a run, "
                                      "<run.output_dir>/eval-<model dir name> for a model)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. data.val_path=test.jsonl")
    args = parser.parse_intermixed_args(argv)

    import accel_backends

    from ...runtime import Interrupted, WorkerFailed, report_early_end, run, under_launcher

    try:
        config, target = configure(args)
        found = problems(config, check_model="model" in target)
        if "run" in target and under_launcher():
            found.append("under torchrun, evaluate a model directory: accel-grpo export the checkpoint first")
        if found:
            raise ExportError("cannot evaluate: " + "; ".join(found))
        if "run" in target:
            checkpoint.checkpoint_meta(target["checkpoint"])  # complete, every file the size its save recorded
        world_size = worker_count(config, args.nproc)
        accel_backends.get_backend()  # an unknown or unusable backend stops us here
        if config.rollout.engine == "vllm":  # vLLM missing, rollout.vllm.* settings: before any worker starts
            from .config import vllm_check

            if vllm_problems := vllm_check(config, world_size):
                raise ExportError("cannot evaluate: " + "; ".join(vllm_problems))
        prompts = load_inputs(config)
        out = Path(args.out) if args.out else default_output(config, target)
        if out.exists() and not out.is_dir():
            raise ExportError(f"output {out} is a file: pass a directory with --out")
    except (ValueError, FileNotFoundError, checkpoint.CorruptCheckpoint, accel_backends.AccelBackendError) as exc:
        print(f"accel-grpo eval: error: {exc}", file=sys.stderr)
        return 2

    is_rank0 = os.environ.get("RANK", "0") == "0"
    if is_rank0:
        out.mkdir(parents=True, exist_ok=True)
        print(f"accel-grpo eval: {target.get('checkpoint') or target['model']}: {prompts} prompts x "
              f"{config.rollout.val_n}, {world_size} process(es)", flush=True)
    exported = out / "model.tmp"
    try:
        weights = None
        if "run" in target:
            export(target["checkpoint"], exported, dtype="fp32", force=True)  # its weights, LoRA merged
            weights = str(exported)
        results = run(worker, world_size, config.to_dict(), str(out), weights)
    except (WorkerFailed, Interrupted) as exc:
        return report_early_end("accel-grpo eval", exc)
    finally:
        shutil.rmtree(exported, ignore_errors=True)
    if not is_rank0:
        return 0
    results = {**target, **results, "val_path": config.data.val_path, "reward": config.data.reward or config.data.task}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"accel-grpo eval: val/accuracy {results['val/accuracy']:.4f}, val/reward_mean "
          f"{results['val/reward_mean']:.4f} ({results['responses']} responses); results: {out / 'results.json'}, "
          f"samples: {out / 'samples.jsonl'}")
    return 0
