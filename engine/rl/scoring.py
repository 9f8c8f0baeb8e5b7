"""A rollout with its rewards: each reward function's own value, their weighted sum and DAPO's soft overlong
penalty (``algorithm.overlong_buffer_len``), kept per sequence so that groups can be cut out of one rollout and
put together with groups of another (dynamic sampling) and so that the metrics can name each reward function.
"""

from __future__ import annotations

import dataclasses

import torch

from ..rollout import RolloutBatch, Trajectories
from . import reward_model
from .formulas import overlong_penalty
from .prompt_types import Sample
from .rewards import Reward, score_each, weighted_sum


@dataclasses.dataclass
class ScoredRollout:
    """One rank's rollout of ``len(samples)`` prompts x ``n`` responses (consecutive rows form a group)."""

    samples: list[Sample]  # one per group
    batch: RolloutBatch
    n: int
    rewards: torch.Tensor  # [B] what the advantages see: the weighted sum of the functions + the overlong penalty
    by_function: torch.Tensor  # [F, B] each reward function's own (unweighted) value
    overlong: torch.Tensor  # [B] the overlong penalty included in rewards (0 when off)
    model_stats: dict = dataclasses.field(default_factory=dict)  # a reward model's figures of this draw

    def __len__(self) -> int:
        return len(self.batch)

    def group_rewards(self) -> torch.Tensor:
        """[groups, n]"""
        return self.rewards.view(-1, self.n)

    @property
    def lengths(self) -> torch.Tensor:
        """[B] response tokens (counting the EOS)."""
        return self.batch.response_mask.sum(dim=1)


def score_rollout(rewards: list[Reward], samples: list[Sample], batch: RolloutBatch, n: int, max_new_tokens: int,
                  overlong_buffer_len: int = 0, overlong_penalty_factor: float = 1.0) -> ScoredRollout:
    """Score every response of ``batch`` (``n`` per sample) with every reward function."""
    per_row = [samples[i // n] for i in range(len(batch))]
    turns = batch.trajectories  # a multi-turn rollout: rewards see each trajectory's messages and environment
    reward_model.take_stats(rewards)  # what validation scored since is not this draw's
    values = score_each(rewards, per_row, batch.responses, completions=turns and turns.completions,
                        environments=turns and turns.instances)
    total = torch.tensor(weighted_sum(rewards, values) if rewards else [0.0] * len(batch), dtype=torch.float32)
    by_function = torch.tensor(values, dtype=torch.float32).view(len(rewards), len(batch))
    penalty = overlong_penalty(batch.response_mask.sum(dim=1), max_new_tokens, overlong_buffer_len,
                               overlong_penalty_factor)
    return ScoredRollout(list(samples), batch, n, total + penalty, by_function, penalty,
                         reward_model.take_stats(rewards))


def select_groups(scored: ScoredRollout, groups: list[int]) -> ScoredRollout:
    """The rollout restricted to ``groups`` (indices of prompts), in that order."""
    rows = torch.tensor([g * scored.n + k for g in groups for k in range(scored.n)], dtype=torch.long)
    b = scored.batch
    batch = dataclasses.replace(b, input_ids=b.input_ids[rows], attention_mask=b.attention_mask[rows],
                                response_mask=b.response_mask[rows], responses=[b.responses[i] for i in rows.tolist()],
                                clipped=b.clipped[rows],
                                sampling_log_probs=None if b.sampling_log_probs is None else b.sampling_log_probs[rows],
                                trajectories=None if b.trajectories is None else b.trajectories.select(rows.tolist()))
    return ScoredRollout([scored.samples[g] for g in groups], batch, scored.n, scored.rewards[rows],
                         scored.by_function[:, rows], scored.overlong[rows], scored.model_stats)


def concat(parts: list[ScoredRollout], pad_token_id: int) -> ScoredRollout:
    """Rollouts of several draws as one: prompts left-padded and responses right-padded to the widest."""
    if len(parts) == 1:
        return parts[0]
    prompt_width = max(p.batch.prompt_length for p in parts)
    response_width = max(p.batch.response_mask.size(1) for p in parts)

    def pad(part: ScoredRollout):
        b = part.batch
        left, right = prompt_width - b.prompt_length, response_width - b.response_mask.size(1)
        ids = torch.nn.functional.pad(b.input_ids, (left, right), value=pad_token_id)
        attention = torch.nn.functional.pad(b.attention_mask, (left, right), value=0)
        sampled = None if b.sampling_log_probs is None else torch.nn.functional.pad(b.sampling_log_probs, (0, right))
        return ids, attention, torch.nn.functional.pad(b.response_mask, (0, right), value=0), sampled

    padded = [pad(p) for p in parts]
    sampled = [log_probs for *_, log_probs in padded]
    batch = RolloutBatch(
        input_ids=torch.cat([ids for ids, *_ in padded]),
        attention_mask=torch.cat([attention for _, attention, *_ in padded]),
        response_mask=torch.cat([mask for _, _, mask, _ in padded]),
        prompt_length=prompt_width,
        responses=[text for p in parts for text in p.batch.responses],
        clipped=torch.cat([p.batch.clipped for p in parts]),
        sampling=parts[0].batch.sampling,  # every draw samples alike: its truncation applies to the log-probs
        tokens_computed=sum(p.batch.tokens_computed for p in parts),
        sampling_log_probs=None if any(x is None for x in sampled) else torch.cat(sampled),
        trajectories=None if parts[0].batch.trajectories is None
        else Trajectories.concat([p.batch.trajectories for p in parts]),
    )
    return ScoredRollout([s for p in parts for s in p.samples], batch, parts[0].n,
                         torch.cat([p.rewards for p in parts]), torch.cat([p.by_function for p in parts], dim=1),
                         torch.cat([p.overlong for p in parts]),
                         reward_model.rank_sums([p.model_stats for p in parts]))


def rollout_sums(drawn: list[ScoredRollout], overlong: bool = False) -> dict[str, float]:
    """Sums over every response this rank drew in a step (to be summed over ranks): rewards, lengths, each reward
    function's values (``reward_fn_<i>``) and, when ``overlong``, the overlong penalty."""
    rewards = torch.cat([part.rewards for part in drawn])
    lengths = torch.cat([part.lengths for part in drawn])
    sums = {"reward_sum": rewards.sum().item(), "reward_sq_sum": (rewards.double() ** 2).sum().item(),
            "sequences": float(len(rewards)), "response_tokens": lengths.sum().item(),
            "clipped": sum(part.batch.clipped.sum().item() for part in drawn)}
    by_function = torch.cat([part.by_function for part in drawn], dim=1)
    for index, values in enumerate(by_function):
        sums[f"reward_fn_{index}"] = values.sum().item()
    if drawn[0].batch.trajectories is not None:  # tools/*, rollout/turns_mean, rollout/tool_tokens
        sums.update(Trajectories.concat([part.batch.trajectories for part in drawn]).sums())
    sums.update(reward_model.rank_sums([part.model_stats for part in drawn]))  # reward_model/*, with one
    if overlong:
        overlong_values = torch.cat([part.overlong for part in drawn])
        sums["overlong_sum"] = overlong_values.sum().item()
        sums["overlong_count"] = float((overlong_values < 0).sum().item())
    return sums


def reward_metrics(totals: dict[str, float], names: list[str]) -> dict[str, float]:
    """``reward/<name>`` (each function's mean, unweighted) and the overlong penalty's mean and share of responses
    it hit, from ``rollout_sums`` summed over ranks."""
    count = totals["sequences"]
    metrics = {name: totals[f"reward_fn_{index}"] / count for index, name in enumerate(names)}
    if "overlong_sum" in totals:
        metrics["overlong_penalty"] = totals["overlong_sum"] / count
        metrics["overlong_frac"] = totals["overlong_count"] / count
    metrics.update(reward_model.metrics(totals))
    return metrics


def sample_records(step: int, scored: ScoredRollout, advantages: torch.Tensor, prompts: int,
                   names: list[str]) -> list[dict]:
    """One record per response of the first ``prompts`` groups: what ``samples.jsonl`` holds for a step."""
    records = []
    lengths = scored.lengths
    for row in range(min(prompts, len(scored.samples)) * scored.n):
        record = {"step": step, "prompt": scored.samples[row // scored.n].prompt,
                  "response": scored.batch.responses[row], "reward": scored.rewards[row].item(),
                  "advantage": advantages[row].item(), "response_tokens": int(lengths[row]),
                  "ended_by_eos": not bool(scored.batch.clipped[row]) and int(lengths[row]) > 0}
        record["rewards"] = {name.removeprefix("reward/"): scored.by_function[index, row].item()
                             for index, name in enumerate(names)}
        if bool(scored.overlong.any()):
            record["overlong_penalty"] = scored.overlong[row].item()
        turns = scored.batch.trajectories
        if turns is not None:  # each turn: the assistant's messages, their tool calls and results
            record["turns"] = turns.completions[row]
            record["tool_calls"] = int(turns.tool_calls[row])
        records.append(record)
    return records
