"""What vLLM's two rollout engines share: the colocated engine (``vllm.py``, vLLM in the trainer's processes) and
server mode (``vllm_server/engine.py``, vLLM behind HTTP servers). Both start vLLM from the same model directory
(the policy's own, or a scratch ``config.json`` with dummy weights), ask with the same sampling fields and per-prompt
seeds, check every pushed weight against the same names and shapes, and resolve ``rollout.vllm.lora_sync`` the same
way; nothing here imports vLLM or names a device.
"""

from __future__ import annotations

import atexit
import copy
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from . import lora_sync
from .base import SamplingConfig
from .registry import RolloutEngineError

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
SEED_RANGE = 2**31 - 1


def request_seeds(seed: int, prompts: int, n: int) -> list[int]:
    """One seed per prompt, ``n`` apart (vLLM draws a prompt's ``n`` samples from its seed onwards)."""
    return [(seed + index * n) % SEED_RANGE for index in range(prompts)]


def sampling_fields(sampling: SamplingConfig) -> dict:
    """vLLM's sampling parameters for every ``SamplingConfig`` field (a seed added per prompt): the colocated
    engine's ``SamplingParams`` and the server engine's JSON alike."""
    want_log_probs = sampling.log_probs and not sampling.greedy
    fields = {"n": sampling.n, "max_tokens": sampling.max_new_tokens, "stop_token_ids": list(sampling.eos_token_ids),
              "detokenize": False, "logprobs": 0 if want_log_probs else None, "repetition_penalty": 1.0}
    if sampling.greedy:
        fields.update(temperature=0.0)
    else:
        fields.update(temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=sampling.top_k if sampling.top_k > 0 else 0)
    return fields


def model_directory(context, rank: int) -> tuple[Path, str]:
    """The policy's own model directory and load format ``auto`` (weights read from it), or a scratch directory
    with its ``config.json`` only and ``dummy`` (the first weight push brings the weights)."""
    if isinstance(context.model, (str, Path)) and (Path(context.model) / "config.json").is_file():
        return Path(context.model), "auto"
    return write_model_config(context.policy.module, scratch_directory(f"accel-vllm-model-{rank}-")), "dummy"


def write_model_config(module, directory: Path) -> Path:
    """``config.json`` of the Hugging Face model inside ``module`` (a policy's, possibly wrapped), for vLLM."""
    from transformers import PreTrainedModel

    model = next((m for m in module.modules() if isinstance(m, PreTrainedModel)), None)
    if model is None:
        raise RolloutEngineError("rollout.engine=vllm needs a Hugging Face model (a PreTrainedModel) as the policy")
    from torch.distributed.fsdp import FSDPModule

    config = copy.deepcopy(model.config)
    # What vLLM picks its implementation by: the model's own class, not FSDP2's subclass of it.
    config.architectures = [next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule)).__name__]
    config.save_pretrained(directory)
    return directory


def expected_weights(model_dir: Path) -> dict[str, torch.Size]:
    """The model's parameter names and shapes as the trainer names them (built on the meta device: no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: param.shape for name, param in model.named_parameters()}


class CheckedWeights:
    """The pushed weights, each checked against the model's names and shapes and copied before the engine sees it
    (the policy's tensor is valid only until the next is drawn). ``last`` names the tensor being loaded."""

    def __init__(self, weights: Iterable[tuple[str, torch.Tensor]], expected: dict[str, torch.Size]) -> None:
        self.weights, self.expected = weights, expected
        self.seen: set[str] = set()
        self.last: str | None = None

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.weights:
            self.last = name
            shape = self.expected.get(name)
            if shape is None:
                raise RolloutEngineError(f"rollout engine 'vllm' cannot take weight {name!r}: the engine's model has "
                                         "no tensor of that name (is the policy the model vLLM was started from?)")
            if tuple(tensor.shape) != tuple(shape):
                raise RolloutEngineError(f"rollout engine 'vllm' cannot take weight {name!r} of shape "
                                         f"{tuple(tensor.shape)}: the engine's model has shape {tuple(shape)}")
            self.seen.add(name)
            yield name, tensor.detach().clone()

    def missing(self) -> list[str]:
        return sorted(set(self.expected) - self.seen)


def lora_rank_of(policy) -> int:
    """The policy's LoRA rank (0: no LoRA, or a test double without one)."""
    return int(getattr(getattr(policy, "lora_config", None), "r", 0) or 0)


def choose_lora_sync(settings, lora_rank: int, expected: dict, decoded: int | None, own_wire: bool = True) -> str:
    """``rollout.vllm.lora_sync`` resolved for this run (``lora_sync.choose``): the base model's parameters from
    its shapes; ``decoded``: the most tokens a step decodes per engine copy, where known."""
    base = sum(torch.Size(shape).numel() for shape in expected.values())
    return lora_sync.choose(getattr(settings, "lora_sync", "merged"), lora_rank, base, decoded, own_wire=own_wire)


def scratch_directory(prefix: str) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory
