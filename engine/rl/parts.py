"""The pieces of an RL run that the step (``step.py``) assembles once per rank, each built by one function here:
the data and rewards, the frozen models, the rollout side (sampling settings, rollout engine, sampler), and the
cores borrowed from local vLLM servers."""

from __future__ import annotations

import dataclasses

from .. import runtime
from ..rollout import RolloutContext, build_sampler, create_rollout_engine, eos_token_ids, sampling_configs
from ..rollout.borrowing import borrow_idle_cores
from ..runtime import BorrowedThreads
from .engine_settings import reward_model_engine
from .frozen import FrozenModel
from .model import build_model
from .prompts import build_tasks, data_spec, needs_answers
from .reward_model import model_rewards
from .rewards import environment_rewards, load_rewards
from .sizes import max_sequence_tokens


def load_inputs(config, verbose: bool = False):
    """``(tokenizer, model factory, (task, validation samples), the data's rewards)``: the config enters data
    loading here, once (spec -> rewards -> prompts); bad input fails here with one line."""
    tokenizer, factory = build_model(config.model)
    spec = data_spec(config)
    rewards = load_rewards(list(spec.rewards), spec.reward_style)
    return tokenizer, factory, build_tasks(spec, tokenizer, needs_answers(rewards), verbose=verbose), rewards


def run_rewards(config, file_rewards: list) -> list:
    """The run's reward functions: the data's, an environment's ``get_reward()`` as a reward of its own (then
    ``data.reward`` is optional), and a reward model or judge (``reward_model.*``, loaded on this rank)."""
    used = [] if config.rollout.environment and not config.data.reward else file_rewards
    return used + environment_rewards(config.rollout.environment) + model_rewards(config, None, reward_model_engine)


def frozen_models(specs: dict, policy_source, policy, backend) -> dict[str, FrozenModel]:
    """The frozen models an algorithm asked for (``Algorithm.frozen_models``), by name, built in that order."""
    return {name: FrozenModel.build(name, spec, policy_source, policy, backend) for name, spec in specs.items()}


@dataclasses.dataclass
class RolloutParts:
    sampling: object  # SamplingConfig of the training rollouts
    val_sampling: object  # and of validation
    engine: object  # the rollout engine
    sampler: object  # single-turn, or multi-turn with tools or an environment


def rollout_parts(config, policy, tokenizer, policy_source, backend, prompts_per_rank: int) -> RolloutParts:
    """The sampling settings, the rollout engine (``rollout.engine``) and the sampler, chosen once. The tokens a rank
    decodes per step (``prompts_per_rank`` x n x max_new_tokens) let an engine choose how it takes weights
    (``rollout.vllm.lora_sync=auto``)."""
    sampling, val_sampling = sampling_configs(config.rollout, eos_token_ids(policy.module, tokenizer))
    engine = create_rollout_engine(config.rollout.engine, RolloutContext(
        policy, tokenizer, policy_source, config.rollout, max_sequence_tokens(config),
        decoded_tokens=prompts_per_rank * config.rollout.n * config.rollout.max_new_tokens))
    # The engine's log-probs, for the mismatch metrics and algorithm.rollout_correction, where they are cheap.
    sampling = dataclasses.replace(sampling, log_probs=engine.cheap_log_probs)
    # Single-turn, or multi-turn with tools or an environment (every rank's engine calls in step).
    sampler = build_sampler(config, tokenizer, lambda flag: runtime.on_any_rank(flag, backend.metrics_device()))
    return RolloutParts(sampling, val_sampling, engine, sampler)


def borrow_server_cores(rollout_engine, ahead) -> BorrowedThreads | None:
    """``rollout.vllm.borrow_threads`` (servers on this host's cores): this thread's compute takes more threads
    while no request is in flight (synchronously: whenever it computes); the server engine's plan says how."""
    return borrow_idle_cores(rollout_engine, lambda: ahead is not None and ahead.sampling())
