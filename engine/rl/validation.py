"""Held-out validation: ``rollout.val_n`` samples per prompt (greedy by default), scored by the rewards.

Sampling goes through the same rollout engine as training. Every rank takes every ``world_size``-th prompt;
ranks make the same number of engine calls (the built-in engines gather the sharded model for each call, a
collective), so a rank with fewer prompts repeats its last one and does not count it.
"""

from __future__ import annotations

import math

from ..rollout import RolloutEngine, Sampler, SamplingConfig
from ..runtime import sum_over_ranks
from .rewards import score_all

CORRECT = 1.0  # a response counts as correct when its reward is at least this


def validate(policy, rollout_engine: RolloutEngine, sampler: Sampler, samples, rewards, sampling: SamplingConfig,
             batch_prompts: int, records: list | None = None) -> dict:
    """``val/reward_mean`` and ``val/accuracy`` over all held-out prompts of all ranks (``policy``: the actor's
    ``FSDPEngine``, for ranks and the metric reduction).

    ``records``: a list to which this rank appends each of its scored responses (``index`` of the prompt in
    ``samples``, prompt, answer, response, reward). ``sampler``: the run's single- or multi-turn sampler.
    """
    rank, world = policy.rank, policy.world_size
    mine = samples[rank::world]
    calls = math.ceil(math.ceil(len(samples) / world) / batch_prompts)
    n = sampling.n
    total = correct = count = 0.0
    with policy.eval_mode():
        for call in range(calls):
            chunk = mine[call * batch_prompts:(call + 1) * batch_prompts]
            real = len(chunk)
            chunk = chunk + [(mine or samples)[-1]] * (batch_prompts - real)  # same shape on every rank
            batch = sampler(rollout_engine, chunk, sampling)
            if not real:
                continue  # this rank only kept the others company in generate
            turns = batch.trajectories
            scores = score_all(rewards, [s for s in chunk[:real] for _ in range(n)], batch.responses[:real * n],
                               completions=turns and turns.completions[:real * n],
                               environments=turns and (turns.instances or [])[:real * n] or None)
            if records is not None:
                for row, score in enumerate(scores):
                    sample = chunk[row // n]
                    records.append({"index": rank + (call * batch_prompts + row // n) * world, "prompt": sample.prompt,
                                    "answer": sample.answer, "response": batch.responses[row], "reward": score})
            total += sum(scores)
            correct += sum(1.0 for value in scores if value >= CORRECT)
            count += len(scores)
    summed = sum_over_ranks({"total": total, "correct": correct, "count": count}, policy.backend.metrics_device())
    total, correct, count = summed["total"], summed["correct"], summed["count"]
    return {"val/reward_mean": total / max(count, 1.0), "val/accuracy": correct / max(count, 1.0)}
