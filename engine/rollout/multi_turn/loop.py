"""The multi-turn rollout: generate, run the tool calls, append their results as tokens, generate again.

Token in, token out: a trajectory's tokens are its prompt's ids, then each turn's ids exactly as the engine
returned them, then the ids of the tool messages as the chat template renders them (``template.inserted_text``),
and so on; nothing earlier is ever re-tokenized. The model's own tokens are 1 in the loss mask (``response_mask``);
tool and template tokens are 0 there but 1 in the attention mask, so every forward sees them and no loss, KL or
entropy term counts them. ``rollout.max_new_tokens`` bounds the model's and the tools' tokens of a trajectory
together.

The engine is asked again (``n=1``, one row per trajectory still going) after each round of tool calls: any
rollout engine works. Every rank makes the same number of engine calls (an engine may step with the other ranks):
a rank whose trajectories all ended makes a one-token call and discards it while others go on.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import torch

from ..engines import RolloutEngine, SamplingConfig
from ..engines.hf import left_padded
from ..single_turn import RolloutBatch, check_responses
from ..trajectories import Trajectories
from .execution import run_calls
from .parsing import parse_turn
from .template import encode, inserted_text, prompt_ids


@dataclasses.dataclass
class Limits:
    max_tool_calls: int = 8  # per trajectory
    max_tool_response_tokens: int = 256  # each tool result cut to this
    tool_timeout_s: float = 30.0
    max_parallel_tool_calls: int = 8  # calls of one round running at once


@dataclasses.dataclass
class Trajectory:
    messages: list[dict]  # the prompt's messages (the environment's reset text appended)
    tools: dict[str, Callable]
    environment: object
    prompt: list[int]
    ids: list[int] = dataclasses.field(default_factory=list)  # the response region: model, tool and template tokens
    loss: list[int] = dataclasses.field(default_factory=list)  # 1: the model's own token
    log_probs: list[float] = dataclasses.field(default_factory=list)
    completion: list[dict] = dataclasses.field(default_factory=list)
    turns: int = 0
    calls: int = 0
    failures: int = 0
    done: bool = False
    clipped: bool = False

    def end(self, clipped: bool = False) -> None:
        self.done, self.clipped = True, clipped


def prompt_messages(sample, system_prompt: str | None = None) -> list[dict]:
    """The sample's prompt as chat messages (a text prompt is one user message)."""
    raw = sample.raw_prompt
    if isinstance(raw, list):
        messages = [{"role": m["role"], "content": m["content"]} for m in raw]
    else:
        messages = [{"role": "user", "content": raw if isinstance(raw, str) else sample.prompt}]
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


class MultiTurnRollout:
    """Rolls out trajectories with tools; ``tools``: stateless ``{name: function}``; ``environment``: a class built
    once per trajectory, whose bound public methods join the tools. ``schemas`` are what the template renders."""

    def __init__(self, tokenizer, schemas: list[dict], tools: dict[str, Callable], limits: Limits,
                 environment: type | None = None, bind_tools: Callable | None = None,
                 system_prompt: str | None = None, any_rank: Callable[[bool], bool] | None = None) -> None:
        self.tokenizer, self.schemas, self.tools, self.limits = tokenizer, schemas, tools, limits
        self.environment, self.bind_tools, self.system_prompt = environment, bind_tools, system_prompt
        self.any_rank = any_rank or (lambda flag: flag)

    def start(self, sample) -> Trajectory:
        messages = prompt_messages(sample, self.system_prompt)
        tools, environment = dict(self.tools), None
        if self.environment is not None:
            environment = self.environment()
            observation = environment.reset(**sample.row)
            if isinstance(observation, str) and observation:
                messages[-1] = {**messages[-1], "content": messages[-1]["content"] + observation}
            tools.update(self.bind_tools(environment))
        return Trajectory(messages, tools, environment, prompt_ids(self.tokenizer, messages, self.schemas))

    def __call__(self, engine: RolloutEngine, samples: list, sampling: SamplingConfig) -> RolloutBatch:
        """``sampling.n`` trajectories per sample (consecutive rows form a group), as a ``RolloutBatch``."""
        if self.environment is None:  # the n trajectories of a prompt start alike: render it once
            trajectories = [dataclasses.replace(first, messages=list(first.messages), ids=[], loss=[], log_probs=[],
                                                completion=[])
                            for first in map(self.start, samples) for _ in range(sampling.n)]
        else:
            trajectories = [self.start(sample) for sample in samples for _ in range(sampling.n)]
        computed, first = 0, True
        while True:
            active = [t for t in trajectories if not t.done]
            if not self.any_rank(bool(active)):
                break
            if not active:  # keep the other ranks company in the engine
                engine.generate([trajectories[0].prompt], dataclasses.replace(sampling, n=1, max_new_tokens=1))
                continue
            computed += self._turn(engine, active, sampling, first)
            first = False
        return self._batch(trajectories, sampling, computed)

    # -- one round ----------------------------------------------------------------------------------------------

    def _generate(self, engine, active: list[Trajectory], sampling: SamplingConfig, first: bool):
        n = sampling.n
        groups = [active[i:i + n] for i in range(0, len(active), n)]
        if first and all(all(t.prompt == g[0].prompt for t in g) for g in groups):
            call = dataclasses.replace(sampling, n=n)  # the group's n samples of one prompt, as a plain rollout
            prompts = [g[0].prompt for g in groups]
        else:
            room = max(sampling.max_new_tokens - len(t.ids) for t in active)
            call = dataclasses.replace(sampling, n=1, max_new_tokens=room)
            prompts = [t.prompt + t.ids for t in active]
        responses = engine.generate(prompts, call)
        responses = dataclasses.replace(responses, token_ids=responses.token_ids.cpu(), mask=responses.mask.cpu(),
                                        log_probs=None if responses.log_probs is None else responses.log_probs.cpu())
        check_responses(engine.name, responses, len(prompts), call)
        return responses

    def _turn(self, engine, active: list[Trajectory], sampling: SamplingConfig, first: bool) -> int:
        responses = self._generate(engine, active, sampling, first)
        eos = set(sampling.eos_token_ids)
        waiting = []
        for row, t in enumerate(active):
            length = int(responses.mask[row].sum())
            ids = responses.token_ids[row, :length].tolist()[:sampling.max_new_tokens - len(t.ids)]
            log_probs = [0.0] * len(ids) if responses.log_probs is None else \
                responses.log_probs[row, :len(ids)].float().tolist()
            t.ids += ids
            t.loss += [1] * len(ids)
            t.log_probs += log_probs
            t.turns += 1
            ended = bool(ids) and ids[-1] in eos
            text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
            parsed = parse_turn(text, self.tokenizer) if ended else None
            if parsed is None or not parsed.calls or t.calls + len(parsed.calls) > self.limits.max_tool_calls:
                # The answer: no call, a malformed one, more calls than allowed, or the budget ran out.
                t.completion.append({"role": "assistant",
                                     "content": self.tokenizer.decode(ids, skip_special_tokens=True)})
                t.end(clipped=not ended and len(t.ids) >= sampling.max_new_tokens)
                continue
            waiting.append((t, parsed, self.tokenizer.decode(ids[-1:], skip_special_tokens=False)))
        jobs = [(t.tools, call) for t, parsed, _ in waiting for call in parsed.calls]
        results = iter(run_calls(jobs, timeout_s=self.limits.tool_timeout_s,
                                 parallel=self.limits.max_parallel_tool_calls, tokenizer=self.tokenizer,
                                 max_tokens=self.limits.max_tool_response_tokens))
        for t, parsed, end_text in waiting:
            assistant = {"role": "assistant", "content": parsed.content,
                         "tool_calls": [call.message() for call in parsed.calls]}
            outcomes = [next(results) for _ in parsed.calls]
            tool_messages = [{"role": "tool", "name": call.name, "content": outcome.content}
                             for call, outcome in zip(parsed.calls, outcomes, strict=True)]
            t.calls += len(parsed.calls)
            t.failures += sum(outcome.failed for outcome in outcomes)
            t.completion += [assistant, *tool_messages]
            text = inserted_text(self.tokenizer, t.messages + t.completion[:-len(tool_messages)], tool_messages,
                                 self.schemas, end_text)
            inserted = encode(self.tokenizer, text) if text is not None else None
            if inserted is None:  # the model ended its turn with an EOS id the template does not end turns with
                t.end()
            elif len(t.ids) + len(inserted) >= sampling.max_new_tokens:
                t.end(clipped=True)  # the result would leave no room for the model: the trajectory ends here
            else:
                t.ids += inserted
                t.loss += [0] * len(inserted)
                t.log_probs += [0.0] * len(inserted)
        return int(responses.tokens_computed)

    # -- the batch ----------------------------------------------------------------------------------------------

    def _batch(self, trajectories: list[Trajectory], sampling: SamplingConfig, computed: int) -> RolloutBatch:
        pad_id = self.tokenizer.pad_token_id
        prompt_tensor, prompt_mask = left_padded([t.prompt for t in trajectories], 1, pad_id)
        width = max(1, max(len(t.ids) for t in trajectories))

        def rows(values, fill, dtype):
            out = torch.full((len(trajectories), width), fill, dtype=dtype)
            for index, row in enumerate(values):
                out[index, :len(row)] = torch.tensor(row, dtype=dtype)
            return out

        response_ids = rows([t.ids for t in trajectories], pad_id, torch.long)
        attention = rows([[1] * len(t.ids) for t in trajectories], 0, torch.long)
        loss = rows([t.loss for t in trajectories], 0, torch.long)
        counts = [[t.turns, t.calls, t.failures, len(t.loss) - sum(t.loss)] for t in trajectories]
        columns = torch.tensor(counts, dtype=torch.long).T
        return RolloutBatch(
            input_ids=torch.cat([prompt_tensor, response_ids], dim=1),
            attention_mask=torch.cat([prompt_mask, attention], dim=1),
            response_mask=loss,
            prompt_length=prompt_tensor.size(1),
            responses=[self.tokenizer.decode(t.ids, skip_special_tokens=True) for t in trajectories],
            clipped=torch.tensor([t.clipped for t in trajectories], dtype=torch.bool),
            sampling=sampling,
            tokens_computed=computed,
            sampling_log_probs=rows([t.log_probs for t in trajectories], 0.0, torch.float32)
            if sampling.log_probs else None,
            trajectories=Trajectories([copy.deepcopy(t.completion) for t in trajectories],
                                      [t.environment for t in trajectories], *columns),
        )
