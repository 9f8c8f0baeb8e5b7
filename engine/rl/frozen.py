"""Frozen models: the models an RL step scores its own tokens with and never trains (the KL reference, a
distillation teacher). Each gives the log-probs of this rank's share of the step's sequences, planned as the
update's micro-batches (``logprobs.planned_log_probs``), under the sampling distribution.

A frozen model is its own engine (``FSDPEngine`` with ``frozen=True``: sharded like the policy, its parameters in
host memory between uses when offloaded), or, for the reference of a LoRA policy, the policy itself with its
adapters disabled (its base model: no second copy of the weights).
"""

from __future__ import annotations

import dataclasses

import torch

from .. import FSDPEngine
from .logprobs import planned_log_probs


@dataclasses.dataclass(frozen=True)
class FrozenSpec:
    """What an algorithm asks for: a frozen model built from ``source`` (a model directory or factory; None: the
    policy's own initial weights) with ``engine`` (an ``EngineConfig`` with ``frozen=True``)."""

    engine: object
    source: object = None


class FrozenModel:
    """One frozen model by ``name`` (``ref``, ``teacher``): the name its log-probs go by in the step's data, its
    phase (``<name>_log_probs``) and its pad-token count."""

    def __init__(self, name: str, engine: FSDPEngine | None = None, adapters_of: FSDPEngine | None = None) -> None:
        if (engine is None) == (adapters_of is None):
            raise ValueError("a frozen model is an engine of its own or a LoRA policy's base model, one of them")
        self.name, self.engine, self.adapters_of = name, engine, adapters_of

    @classmethod
    def build(cls, name: str, spec: FrozenSpec, policy_source, policy: FSDPEngine, backend) -> FrozenModel:
        """The model ``spec`` asks for; a copy of the policy's initial weights under LoRA is its base model."""
        if spec.source is None and policy.config.lora_rank > 0:
            return cls(name, adapters_of=policy)
        source = policy_source if spec.source is None else spec.source
        return cls(name, engine=FSDPEngine(source, spec.engine, backend))

    def log_probs(self, data, rollout) -> torch.Tensor:
        """``[N, R]`` log-probs of this rank's share of ``data`` (a ``StepData``) at ``rollout``'s temperature,
        top-k and top-p; the rows of other ranks' shares are 0."""
        if self.engine is not None:
            with self.engine.eval_mode():
                return planned_log_probs(self.engine, data, rollout.temperature, self.name, top_k=rollout.top_k,
                                         top_p=rollout.top_p)
        from peft import PeftModel

        peft_model = next(m for m in self.adapters_of.module.modules() if isinstance(m, PeftModel))
        with self.adapters_of.eval_mode(), peft_model.disable_adapter():
            return planned_log_probs(self.adapters_of, data, rollout.temperature, self.name, top_k=rollout.top_k,
                                     top_p=rollout.top_p)
