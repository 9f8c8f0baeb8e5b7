"""engine/rollout/multi_turn/loop.py with a scripted in-process engine: token in, token out (the engine's ids are kept
as returned, tool results are the template's rendering), the loss mask against the attention mask, the
rollout.max_new_tokens budget, rollout.max_tool_calls, malformed calls, environments written for TRL, rewards that
see the messages and environments, metrics, and the engine calls every rank makes in step."""

import dataclasses
import json

import agent_tools
import pytest
import torch

from engine.demo_model import build_tokenizer
from engine.rl import scoring
from engine.rl.algorithms.grpo.config import GRPOConfig
from engine.rl.prompts import Sample
from engine.rl.rewards import Reward, environment_rewards
from engine.rollout import multi_turn as agent
from engine.rollout.engines import Responses, RolloutContext, RolloutEngine, SamplingConfig
from engine.rollout.multi_turn.template import encode

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 + 7"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def char_by_char(tokenizer, text):
    """Ids the tokenizer would never produce for ``text`` (one per character): re-tokenizing would change them."""
    return [i for ch in text for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]


class Scripted(RolloutEngine):
    """Answers each prompt with ``script(conversation_text, call_index)`` (token ids); records every call and
    returns log-probs -0.01 x (position + 1) so their alignment can be checked."""

    def __init__(self, tokenizer, script):
        super().__init__(RolloutContext(None, tokenizer, None))
        self.name, self.script, self.calls = "scripted", script, []

    def generate(self, prompts, sampling):
        self.calls.append(([list(p) for p in prompts], sampling))
        text = [self.context.tokenizer.decode(p) for p in prompts for _ in range(sampling.n)]
        rows = [self.script(t, len(self.calls) - 1)[:sampling.max_new_tokens] for t in text]
        width = max(len(r) for r in rows)
        ids, mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.long)
        for index, row in enumerate(rows):
            ids[index, :len(row)], mask[index, :len(row)] = torch.tensor(row), 1
        log_probs = -0.01 * (torch.arange(width) + 1).float().expand(len(rows), width) * mask
        return Responses(ids, mask, int(mask.sum()) + 3, log_probs if sampling.log_probs else None)


def rollout_with(tokenizer, **rollout):
    config = GRPOConfig()
    for key, value in {"tools": ["agent_tools:calculator"], **rollout}.items():
        setattr(config.rollout, key, value)
    return agent.build(config, tokenizer)


def sampling_for(tokenizer, n=2, max_new_tokens=200, log_probs=True):
    return SamplingConfig(n=n, max_new_tokens=max_new_tokens, log_probs=log_probs,
                          eos_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))


def question(text="What is 12 + 7?", **row):
    return Sample(prompt="(unused)", raw_prompt=[{"role": "user", "content": text}], row={"answer": "19", **row})


def test_token_in_token_out_with_a_loss_mask_over_the_models_tokens_only(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first = char_by_char(tokenizer, CALL) + [end]
    assert tokenizer(CALL, add_special_tokens=False)["input_ids"] != first[:-1]  # re-tokenizing would differ
    answer = tokenizer("The answer is 19.", add_special_tokens=False)["input_ids"] + [end]
    engine = Scripted(tokenizer, lambda text, call: first if call == 0 else answer)
    batch = rollout_with(tokenizer)(engine, [question()], sampling_for(tokenizer))

    (prompts, sampling), (continued, again) = engine.calls
    assert sampling.n == 2 and len(prompts) == 1  # the first turn: the group's n samples of one prompt
    inserted = encode(tokenizer, "\n<|im_start|>user\n<tool_response>\n19\n</tool_response><|im_end|>\n"
                                 "<|im_start|>assistant\n")
    assert again.n == 1 and again.max_new_tokens == 200 - len(first) - len(inserted)
    assert continued == [prompts[0] + first + inserted] * 2  # exactly the tokens so far, nothing re-tokenized
    response = first + inserted + answer
    for row in range(2):
        length = int(batch.attention_mask[row, batch.prompt_length:].sum())
        assert batch.response_ids[row, :length].tolist() == response
        assert batch.response_mask[row, :length].tolist() == [1] * len(first) + [0] * len(inserted) + [1] * len(answer)
        expected = [-0.01 * (i + 1) for i in range(len(first))] + [0.0] * len(inserted) + \
                   [-0.01 * (i + 1) for i in range(len(answer))]
        assert torch.allclose(batch.sampling_log_probs[row, :length], torch.tensor(expected))
    assert batch.trajectories.turns.tolist() == [2, 2] and batch.trajectories.tool_calls.tolist() == [1, 1]
    turns = batch.trajectories
    assert turns.tool_tokens.tolist() == [len(inserted)] * 2 and turns.tool_failures.tolist() == [0, 0]
    assert not batch.clipped.any() and batch.tokens_computed == (2 * len(first) + 3) + (2 * len(answer) + 3)
    assert batch.trajectories.completions[0] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12 + 7"}}}]},
        {"role": "tool", "name": "calculator", "content": "19"},
        {"role": "assistant", "content": "The answer is 19."}]
    assert batch.responses[0].endswith("<tool_response>\n19\n</tool_response>\nassistant\nThe answer is 19.")

    # Rewards: a TRL-style function gets the messages; a simple one the trajectory's text.
    seen = {}

    def trl_reward(prompts, completions, **columns):
        seen["completions"], seen["columns"] = completions, sorted(columns)
        return [1.0 if "19" in c[-1]["content"] else 0.0 for c in completions]

    scored = scoring.score_rollout([Reward("trl", trl_reward, "trl")], [question()], batch, 2, 200)
    assert scored.rewards.tolist() == [1.0, 1.0] and seen["completions"] == batch.trajectories.completions
    assert "environments" not in seen["columns"]
    sums = scoring.rollout_sums([scored])
    assert sums["response_tokens"] == 2 * (len(first) + len(answer))  # the model's own tokens only
    metrics = agent.metrics(sums)
    assert metrics == {"tools/call_frequency": 1.0, "tools/failure_frequency": 0.0, "rollout/turns_mean": 2.0,
                       "rollout/tool_tokens": 2.0 * len(inserted)}
    (record, _) = scoring.sample_records(1, scored, torch.zeros(2), 1, ["reward/trl"])
    assert record["turns"] == batch.trajectories.completions[0] and record["tool_calls"] == 1
    picked = scoring.select_groups(scored, [0])
    assert picked.batch.trajectories.completions == batch.trajectories.completions
    joined = scoring.concat([scored, scored], tokenizer.pad_token_id)
    assert joined.batch.trajectories.turns.tolist() == [2] * 4


def test_the_budget_bounds_model_and_tool_tokens_together(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first = tokenizer(CALL, add_special_tokens=False)["input_ids"] + [end]
    engine = Scripted(tokenizer, lambda text, call: first)
    # Room for the call, not for its result as well: the trajectory ends there, cut.
    batch = rollout_with(tokenizer)(engine, [question()], sampling_for(tokenizer, max_new_tokens=len(first) + 5))
    assert len(engine.calls) == 1 and batch.clipped.all()
    assert batch.trajectories.tool_calls.tolist() == [1, 1] and batch.trajectories.tool_tokens.tolist() == [0, 0]
    assert batch.response_mask.sum(1).tolist() == [len(first)] * 2
    # A turn cut by the budget before its EOS is the answer, and clipped.
    short = rollout_with(tokenizer)(Scripted(tokenizer, lambda text, call: first), [question()],
                                    sampling_for(tokenizer, max_new_tokens=4))
    assert short.clipped.all() and short.trajectories.tool_calls.tolist() == [0, 0] and short.response_mask.sum() == 8


def test_too_many_calls_and_malformed_calls_end_the_trajectory_as_text(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    two = tokenizer(CALL + "\n" + CALL, add_special_tokens=False)["input_ids"] + [end]
    batch = rollout_with(tokenizer, max_tool_calls=1)(Scripted(tokenizer, lambda text, call: two), [question()],
                                                      sampling_for(tokenizer))
    assert batch.trajectories.tool_calls.tolist() == [0, 0] and batch.trajectories.turns.tolist() == [1, 1]
    assert not batch.clipped.any() and batch.trajectories.completions[0][0]["content"].count("<tool_call>") == 2
    bad = tokenizer("<tool_call>{oops</tool_call>", add_special_tokens=False)["input_ids"] + [end]
    batch = rollout_with(tokenizer)(Scripted(tokenizer, lambda text, call: bad), [question()],
                                    sampling_for(tokenizer))
    assert batch.trajectories.turns.tolist() == [1, 1] and batch.trajectories.tool_calls.tolist() == [0, 0]


def test_failing_calls_are_results_and_counted(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    unknown = tokenizer('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
                        add_special_tokens=False)["input_ids"] + [end]
    answer = tokenizer("I do not know.", add_special_tokens=False)["input_ids"] + [end]
    batch = rollout_with(tokenizer)(Scripted(tokenizer, lambda text, call: unknown if call == 0 else answer),
                                    [question()], sampling_for(tokenizer, n=1, max_new_tokens=300))
    assert batch.trajectories.tool_failures.tolist() == [1] and batch.trajectories.turns.tolist() == [2]
    assert "unknown tool 'search'" in json.loads(batch.trajectories.completions[0][1]["content"])["error"]
    assert agent.metrics({"sequences": 1.0, **batch.trajectories.sums()})["tools/failure_frequency"] == 1.0


def test_an_environment_written_for_trl_runs_unchanged(tokenizer):
    config = GRPOConfig()
    config.rollout.environment = "agent_tools:RewardingEnv"
    config.data.reward = "agent_tools:reached_target"
    multi_turn = agent.build(config, tokenizer)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    add = tokenizer('<tool_call>{"name": "add", "arguments": {"amount": 19}}</tool_call>',
                    add_special_tokens=False)["input_ids"] + [end]
    done = tokenizer("Done.", add_special_tokens=False)["input_ids"] + [end]
    engine = Scripted(tokenizer, lambda text, call: add if "Reach 19." in text and call == 0 else done)
    batch = multi_turn(engine, [question()], sampling_for(tokenizer))
    assert "What is 12 + 7? Reach 19.<|im_end|>" in tokenizer.decode(engine.calls[0][0][0])  # reset's text
    first, second = batch.trajectories.environments
    assert first is not second and first.total == second.total == 19  # one instance per trajectory
    assert batch.trajectories.completions[0][1] == {"role": "tool", "name": "add", "content": "total is 19"}
    rewards = [Reward("agent_tools:reached_target", agent_tools.reached_target, "trl"),
               *environment_rewards(config.rollout.environment)]
    assert [r.name for r in rewards] == ["reached_target", "get_reward"]
    scored = scoring.score_rollout(rewards, [question()], batch, 2, 200)
    assert scored.by_function.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_every_rank_makes_the_same_engine_calls(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    done = tokenizer("7", add_special_tokens=False)["input_ids"] + [end]
    busy = iter([True, True, True, False])  # another rank still rolls out after this one finished
    seen = []

    def any_rank(flag):
        seen.append(flag)
        return next(busy) or flag

    config = GRPOConfig()
    config.rollout.tools = ["agent_tools:calculator"]
    engine = Scripted(tokenizer, lambda text, call: done)
    batch = agent.build(config, tokenizer, any_rank)(engine, [question()], sampling_for(tokenizer))
    assert seen == [True, False, False, False] and len(engine.calls) == 3
    assert [s.max_new_tokens for _, s in engine.calls[1:]] == [1, 1]  # keeping the others company
    assert batch.response_mask.sum(1).tolist() == [len(done)] * 2


def test_the_first_turn_takes_one_row_per_trajectory_when_the_prompts_differ(tokenizer):
    class RandomEnv(agent_tools.CounterEnv):
        count = 0

        def reset(self, **kwargs):
            RandomEnv.count += 1
            return f" Seed {RandomEnv.count}."

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    multi_turn = rollout_with(tokenizer, tools=None, environment="agent_tools:CounterEnv")
    multi_turn.environment = RandomEnv
    engine = Scripted(tokenizer, lambda text, call: [end])
    multi_turn(engine, [question()], sampling_for(tokenizer, n=3))
    (prompts, sampling), = engine.calls
    assert sampling.n == 1 and len({tuple(p) for p in prompts}) == 3


def test_bad_limits_are_named():
    config = GRPOConfig()
    config.rollout.tools = ["agent_tools:calculator"]
    config.rollout.max_tool_calls, config.rollout.tool_timeout_s = 0, -1
    problems = agent.check(config, None)
    assert any("rollout.max_tool_calls must be a positive integer, got 0" in p for p in problems)
    assert any("rollout.tool_timeout_s must be a positive number" in p for p in problems)
    config = dataclasses.replace(GRPOConfig())
    config.rollout.tools = "agent_tools:calculator"
    assert agent.check(config, None) == ["rollout.tools must be a list of 'module:function' names, got "
                                         "'agent_tools:calculator'"]


def test_a_trainer_built_without_the_cli_check_refuses_a_bad_template(tokenizer):
    from engine.rollout.multi_turn.tools import ToolError

    config = GRPOConfig()
    config.rollout.tools = ["agent_tools:calculator"]
    saved, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        with pytest.raises(ToolError, match="has none"):
            agent.build(config, tokenizer)
    finally:
        tokenizer.chat_template = saved


def test_one_sampler_interface_single_or_multi_turn_chosen_once(tokenizer):
    from engine.rollout import SingleTurnRollout, build_sampler
    from engine.rollout.multi_turn import MultiTurnRollout

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answer = tokenizer("19", add_special_tokens=False)["input_ids"] + [end]
    engine = Scripted(tokenizer, lambda text, call: answer)
    config = GRPOConfig()
    single = build_sampler(config, tokenizer)
    assert isinstance(single, SingleTurnRollout)
    batch = single(engine, [question()], sampling_for(tokenizer))  # the sample's prompt text, as it stands
    assert batch.trajectories is None and batch.responses == ["19", "19"]
    assert tokenizer.decode(engine.calls[0][0][0]) == "(unused)"
    config.rollout.tools = ["agent_tools:calculator"]
    multi = build_sampler(config, tokenizer)
    assert isinstance(multi, MultiTurnRollout)
    batch = multi(engine, [question()], sampling_for(tokenizer))  # the same call: chat messages, tools rendered
    assert batch.trajectories.turns.tolist() == [1, 1] and batch.responses == ["19", "19"]
