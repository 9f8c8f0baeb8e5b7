"""``rollout.engine=vllm``'s factory: the colocated engine, or the server engine with ``rollout.vllm.mode=server``."""

from __future__ import annotations


def create_vllm_engine(context):
    settings = getattr(context.config, "vllm", None)
    if getattr(settings, "mode", "colocate") == "server":
        from .engine import VLLMServerRolloutEngine

        return VLLMServerRolloutEngine(context)
    from engine.rollout.engines.vllm import VLLMRolloutEngine

    return VLLMRolloutEngine(context)
