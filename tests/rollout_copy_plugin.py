"""TEST PLUGIN: a rollout engine with its own unsharded copy of the model, as an inference engine (vLLM) has.

Registered as ``test-copy`` through the ``register_rollout_engines`` hook (load it with
``ACCEL_BACKENDS_PLUGINS=rollout_copy_plugin``, ``tests/`` on the path). It decodes with its copy (the
``hf-continuous`` loop) and loads the policy's weights when the trainer sends them, recording a SHA-256 digest of
every tensor it received, so a test can check that after each update it got exactly the trained weights.
"""

import hashlib

import torch

import accel_backends
from engine.rollout.engines import (
    RolloutEngine,
    hookspecs,  # noqa: F401 - specifies the hook implemented below
)
from engine.rollout.engines.hf import left_padded
from engine.rollout.engines.hf_continuous import decode

ENGINES = []  # every engine built in this process, for the test to inspect


def digest(tensor: torch.Tensor) -> str:
    # A copy: numpy() on the tensor itself would pin the policy's gathered buffer (iter_full_weights refuses that).
    return hashlib.sha256(tensor.detach().cpu().clone().view(torch.uint8).numpy().tobytes()).hexdigest()


class CopyRolloutEngine(RolloutEngine):
    def __init__(self, context):
        super().__init__(context)
        source = context.model
        if callable(source):
            self.model = source()
        else:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        self.model.eval()
        self.received = []  # one {name: digest} per load_weights call
        ENGINES.append(self)

    def generate(self, prompts, sampling):
        pad_id = self.context.tokenizer.pad_token_id
        input_ids, attention_mask = left_padded(prompts, sampling.n, pad_id)
        with torch.no_grad():
            return decode(self.model, input_ids, attention_mask, sampling, pad_id)

    def load_weights(self, weights):
        own = dict(self.model.named_parameters())
        digests = {}
        with torch.no_grad():
            for name, tensor in weights:
                own[name].copy_(tensor)  # a KeyError here: a name the policy sent that this model lacks
                digests[name] = digest(tensor)
        self.received.append(digests)


@accel_backends.hookimpl
def register_rollout_engines(register):
    register("test-copy", CopyRolloutEngine)
