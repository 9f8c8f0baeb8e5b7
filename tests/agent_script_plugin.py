"""TEST PLUGIN: a rollout engine that scripts tool calls, as a tool-using model would make them (the tiny random
model never calls a tool by itself).

Registered as ``test-script`` (load it with ``ACCEL_BACKENDS_PLUGINS=agent_script_plugin``, ``tests/`` on the
path). Each turn reads the conversation so far (the prompt ids it is given) and answers with fixed text, as
tokens ending in ``<|im_end|>``: in a first turn a calculator call for the question's "What is A op B?" (or, in
``mixed`` mode, drawn at random: a direct answer, a malformed call, an unknown tool, two calls at once, a call
with wrong arguments); once a tool result is in the conversation, "The answer is R." with R the last result.
With ``SamplingConfig.log_probs`` it returns the policy's own log-probabilities of those tokens (teacher-forced,
under the sampling distribution), so tests can compare them with the trainer's. ``ACCEL_TEST_SCRIPT=calculator``
(the default ``mixed``) makes every trajectory the same: one call, one answer.
"""

import json
import os
import re

import torch

import accel_backends
from engine.rollout.engines import (
    Responses,
    RolloutEngine,
    hookspecs,  # noqa: F401 - specifies the hook implemented below
)
from engine.rollout.engines.hf import left_padded

QUESTION = re.compile(r"What is (-?\d+ *[-+*/] *-?\d+)")
RESULT = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
CALLS = []  # (prompts, sampling) of every generate call in this process, for tests


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def scripted_turn(conversation: str, draw: float, mode: str) -> str:
    """The next assistant turn for ``conversation`` (the decoded prompt ids)."""
    last_turn = conversation.rsplit("<|im_start|>assistant", 1)
    results = RESULT.findall(last_turn[0].rsplit("<|im_start|>user", 1)[-1]) if len(last_turn) == 2 else []
    if results:
        return f"The answer is {results[-1]}."
    found = QUESTION.findall(conversation)
    expression = found[-1] if found else "1 + 1"
    if mode == "calculator" or draw < 0.5:
        return call("calculator", expression=expression)
    if draw < 0.6:
        return f"The answer is {len(expression)}."
    if draw < 0.7:
        return "<tool_call>\n{\"name\": \"calculator\", \"arguments\": \n</tool_call>"
    if draw < 0.8:
        return call("search", query=expression)
    if draw < 0.9:
        return call("calculator", expression=expression) + "\n" + call("calculator", expression="2 * 3")
    return call("calculator", formula=expression)


class ScriptedRolloutEngine(RolloutEngine):
    receives_weights = False

    def generate(self, prompts, sampling):
        tokenizer = self.context.tokenizer
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        mode = os.environ.get("ACCEL_TEST_SCRIPT", "mixed")
        CALLS.append(([list(p) for p in prompts], sampling))
        rows = []
        for prompt in prompts:
            conversation = tokenizer.decode(prompt, skip_special_tokens=False)
            for _ in range(sampling.n):
                text = scripted_turn(conversation, float(torch.rand(())), mode)
                rows.append((tokenizer(text, add_special_tokens=False)["input_ids"] + [end])[:sampling.max_new_tokens])
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for index, row in enumerate(rows):
            ids[index, :len(row)] = torch.tensor(row)
            mask[index, :len(row)] = 1
        log_probs = self._log_probs(prompts, sampling, ids, mask) if sampling.log_probs else None
        return Responses(ids, mask, int(mask.sum()), log_probs)

    def _log_probs(self, prompts, sampling, ids, mask):
        from engine.rl.logprobs import response_log_probs

        policy = self.context.policy
        prompt_ids, prompt_mask = left_padded(prompts, sampling.n, self.context.tokenizer.pad_token_id)
        with torch.no_grad(), policy.eval_mode():
            values = response_log_probs(policy.module, torch.cat([prompt_ids, ids], 1).to(policy.backend.device()),
                                        torch.cat([prompt_mask, mask], 1).to(policy.backend.device()),
                                        prompt_ids.size(1), sampling.temperature, top_k=sampling.top_k,
                                        top_p=sampling.top_p)
        return values.cpu() * mask


@accel_backends.hookimpl
def register_rollout_engines(register):
    register("test-script", ScriptedRolloutEngine)
