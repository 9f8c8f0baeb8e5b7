"""TEST PLUGIN, a planted fault for the rollout card: a rollout engine with its own copy of the model that keeps
each prompt's cached keys and values (its prefix cache) across weight pushes, as the vLLM bugs the card guards
against did. Registered as ``test-stale-prefix`` through the ``register_rollout_engines`` hook (load it with
``ACCEL_BACKENDS_PLUGINS=stale_prefix_plugin``, ``tests/`` on the path). ``certify --rollout test-stale-prefix``
must fail its prefix-cache property and hold the rest."""

import copy

import torch

import accel_backends
from engine.rollout.engines import (
    Responses,
    RolloutEngine,
    hookspecs,  # noqa: F401 - specifies the hook implemented below
)
from engine.rollout.engines.base import sampling_scores


class StalePrefixEngine(RolloutEngine):
    def __init__(self, context):
        super().__init__(context)
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(context.model, dtype=torch.float32).eval()
        self.prefixes = {}  # prompt ids -> (its keys and values, the next token's logits): never cleared

    def load_weights(self, weights):
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights:
                own[name].copy_(tensor)
        # the fault: self.prefixes is kept, so a prompt seen before starts from the old weights' keys and values

    @torch.no_grad()
    def generate(self, prompts, sampling):
        width = sampling.max_new_tokens
        rows = [self._one(prompt, sampling) for prompt in prompts for _ in range(sampling.n)]
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        log_probs = torch.zeros(len(rows), width)
        for row, (tokens, scores) in enumerate(rows):
            ids[row, :len(tokens)], mask[row, :len(tokens)] = torch.tensor(tokens), 1
            log_probs[row, :len(scores)] = torch.tensor(scores)
        return Responses(ids, mask, int(mask.sum()), log_probs if sampling.log_probs else None)

    def _one(self, prompt, sampling):
        key = tuple(prompt)
        if key not in self.prefixes:
            out = self.model(input_ids=torch.tensor([prompt]), use_cache=True)
            self.prefixes[key] = (out.past_key_values, out.logits[0, -1].float())
        past, logits = copy.deepcopy(self.prefixes[key])
        tokens, scores = [], []
        for _ in range(sampling.max_new_tokens):
            log_scores = torch.log_softmax(sampling_scores(logits, max(sampling.temperature, 1e-6)), -1)
            token = int(log_scores.argmax()) if sampling.greedy else int(torch.multinomial(log_scores.exp(), 1))
            tokens.append(token)
            scores.append(float(log_scores[token]))
            if token in sampling.eos_token_ids:
                break
            out = self.model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()
        return tokens, scores


@accel_backends.hookimpl
def register_rollout_engines(register):
    register("test-stale-prefix", StalePrefixEngine)
