"""What an RL recipe's ``eval`` scores (``accel-grpo eval``; the frame's eval command, ``engine/train/evaluate.py``,
does the rest): a run's validation on its own, for a base model or a checkpoint.

The same code as in-run validation (``validation.validate``: ``rollout.val_n`` samples per held-out prompt, greedy
when ``rollout.val_temperature`` is 0, the run's reward functions, ``val/reward_mean`` and ``val/accuracy``); the
prompt limit (and vLLM's context) is sized from the validation data read. Every scored response is a sample.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..train.recipe import Evaluation
from .engine_settings import engine_config, reward_model_engine
from .model import BUILTIN_MODEL, check_model_dir
from .sizes import prompts_per_rank


def eval_help(tool: str) -> str:
    """``<tool> eval --help``'s paragraph."""
    return f"""{tool} eval scores held-out prompts with the run's rewards: val/reward_mean and val/accuracy
(rollout.val_n samples per prompt, greedy when rollout.val_temperature is 0), every scored response in
samples.jsonl.

examples:
  {tool} eval runs/NAME data.val_path=test.jsonl
  {tool} eval /models/Qwen2.5-0.5B-Instruct data.val_path=test.parquet rollout.engine=vllm"""


def problems(config, target: dict, world_size: int) -> list[str]:
    """What would stop an evaluation, as sentences (the training-only rules of ``config.check`` do not apply)."""
    found = []
    d, r = config.data, config.rollout
    if not (d.val_path or (d.path and d.val_fraction)):
        found.append("no validation data: give data.val_path=FILE (or data.path=FILE with data.val_fraction=F)")
    for key, path in (("data.path", d.path), ("data.val_path", d.val_path)):
        if path and not Path(path).exists():
            found.append(f"{key} {path} does not exist")
    if "model" in target and config.model.path != BUILTIN_MODEL:
        found += check_model_dir(config.model.path)
    if r.val_n < 1 or r.val_temperature < 0 or r.max_new_tokens < 1 or not 0 < r.top_p <= 1 or r.top_k < 0:
        found.append("rollout.val_n and rollout.max_new_tokens must be >= 1, rollout.val_temperature and "
                     "rollout.top_k >= 0, rollout.top_p in (0, 1]")
    if d.chat_template not in ("auto", "none"):
        found.append(f"data.chat_template must be auto or none, got {d.chat_template!r}")
    if not found and config.rollout.engine == "vllm":  # vLLM missing, rollout.vllm.* settings
        from .checks import vllm_check

        found += vllm_check(config, world_size)
    if not found:  # a judge that does not answer would score every held-out response 0
        from .reward_model import reach_problems

        found += reach_problems(config)
    return found


def load_inputs(config) -> dict:
    """Load what the workers will (rewards, tokenizer, every held-out row) so that bad input fails here. Without
    ``data.max_prompt_tokens`` it becomes the longest held-out prompt, so that the rollout engine (vLLM's context)
    is sized for the data evaluated."""
    from .model import build_model
    from .prompts import data_spec, needs_answers, validation_set
    from .rewards import load_rewards

    spec = data_spec(config)
    rewards = load_rewards(list(spec.rewards), spec.reward_style)
    tokenizer, _ = build_model(config.model)
    samples = validation_set(spec, tokenizer, needs_answers(rewards), verbose=True)
    if not samples:
        raise ValueError("the validation set is empty")
    if config.data.max_prompt_tokens is None:
        config.data.max_prompt_tokens = max(len(tokenizer(s.prompt, add_special_tokens=False)["input_ids"])
                                            for s in samples)
    r = config.rollout
    return {"prompts": len(samples), "samples_per_prompt": r.val_n, "temperature": r.val_temperature,
            "max_new_tokens": r.max_new_tokens, "val_path": config.data.val_path,
            "reward": config.data.reward or config.data.task}


def evaluate(config, model_dir: str | None, backend, offload: bool = False) -> Evaluation:
    """This rank's share of the validation: the model built frozen (``model_dir``'s weights, the tokenizer the
    run's own; ``offload``: its parameters in host memory between uses), validated with the run's rollout engine
    and sampling settings."""
    import torch.distributed as dist
    from transformers.utils import logging

    from .. import FSDPEngine
    from ..rollout import (
        RolloutContext,
        SingleTurnRollout,
        create_rollout_engine,
        eos_token_ids,
        sampling_configs,
        sync_weights,
    )
    from ..runtime import sum_over_ranks
    from .model import build_model
    from .prompts import data_spec, needs_answers, validation_set
    from .reward_model import model_rewards
    from .rewards import load_rewards
    from .sizes import max_sequence_tokens
    from .validation import validate

    logging.disable_progress_bar()  # a "Loading weights" bar per rank is noise
    world_size = dist.get_world_size()
    tokenizer, source = build_model(config.model)
    spec = data_spec(config)  # the config enters data loading here, once: spec -> rewards -> prompts
    rewards = load_rewards(list(spec.rewards), spec.reward_style)
    samples = validation_set(spec, tokenizer, needs_answers(rewards), verbose=False)
    # the run's reward model or judge scores held-out responses too
    rewards += model_rewards(config, backend, reward_model_engine)
    # An exported checkpoint has its LoRA merged: the model is evaluated as it is. Evaluation only generates, on
    # whole sequences: a run trained with sequence parallelism is evaluated without it, on any number of processes.
    options = dataclasses.replace(engine_config(config, world_size, frozen_offload=offload), lora_rank=0,
                                  sequence_parallel_size=1)
    engine = FSDPEngine(model_dir or source, options, backend)
    # The same rollout engine and sampling settings as in-run validation (rollout.engine, rollout.val_*).
    _, val_sampling = sampling_configs(config.rollout, eos_token_ids(engine.module, tokenizer))
    rollout_engine = create_rollout_engine(config.rollout.engine, RolloutContext(
        engine, tokenizer, model_dir or source, config.rollout, max_sequence_tokens(config)))
    sync_weights(engine, rollout_engine)  # an engine holding its own copy starts from the evaluated weights
    records: list[dict] = []
    # Single-turn, as before the rollout layer moved: eval loads no tools or environment.
    metrics = validate(engine, rollout_engine, SingleTurnRollout(tokenizer), samples, rewards, val_sampling,
                       batch_prompts=max(1, prompts_per_rank(config, world_size)), records=records)
    responses = sum_over_ranks({"responses": float(len(records))}, backend.metrics_device())["responses"]
    return Evaluation(metrics=metrics, samples=records, results={"responses": int(responses)})
