"""A distillation run's inputs: the RL layer's (tokenizer, model, prompts, rewards), except that the teacher alone
needs no answers: with ``distill.reward_coef`` 0 and no ``data.reward`` named, rows without an answer are kept and
the task's reward is only measured where every row has one."""

from __future__ import annotations

from ...model import build_model
from ...prompts import FileTask, build_tasks, data_spec, needs_answers
from ...rewards import load_rewards


def load_inputs(config, verbose: bool = False):
    """``(tokenizer, model factory, (task, validation samples), rewards)`` as ``engine.rl.parts.load_inputs``."""
    tokenizer, factory = build_model(config.model)
    spec = data_spec(config)
    rewards = load_rewards(list(spec.rewards), spec.reward_style)
    rewarded = bool(config.distill.reward_coef) or bool(config.data.reward)
    task, validation = build_tasks(spec, tokenizer, needs_answers(rewards) and rewarded, verbose=verbose)
    rows = (task.samples if isinstance(task, FileTask) else []) + (validation or [])
    if not rewarded and any(sample.answer is None for sample in rows):
        rewards = []  # nothing to score the responses against: the teacher's log-probs alone train
    return tokenizer, factory, (task, validation), rewards
