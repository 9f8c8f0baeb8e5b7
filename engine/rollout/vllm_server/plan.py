"""Which local vLLM servers a run starts, and with what: a pure function of the settings and the device's facts,
so the choices for devices not present here (cuda, npu) are tested with their facts alone."""

from __future__ import annotations

from collections.abc import Callable

from ..engines.lora_sync import LORA_SLOTS, vllm_max_lora_rank
from .manager import ServerSpec, cli_arguments
from .settings import local_servers, transfer_engine

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def server_options(settings, facts, dtype: str, load_format: str, max_model_len: int | None,
                   lora_rank: int = 0) -> dict:
    """The api_server options: what the engine needs (token ids in and out, log-probs of the sampling
    distribution, the RL routes' weight transfer through the device's engine; with ``lora_rank``, LoRA adapters of
    that rank, two at a time), the device's own arguments, then ``rollout.vllm.server_args`` (which win)."""
    options = {"dtype": settings.dtype or dtype, "enforce_eager": settings.enforce_eager, "seed": 0,
               "generation_config": "vllm", "logprobs_mode": "processed_logprobs", "skip_tokenizer_init": True,
               "enable_scale_out": True, "load_format": load_format,
               "weight_transfer_config": {"backend": transfer_engine(settings, facts)},
               "max_model_len": settings.max_model_len or max_model_len}
    if lora_rank:
        options.update(enable_lora=True, max_lora_rank=vllm_max_lora_rank(lora_rank), max_loras=LORA_SLOTS)
    if facts.memory_fraction:
        options["gpu_memory_utilization"] = settings.gpu_memory_utilization
    options.update(facts.engine_args)
    options.update(settings.server_args)
    return options


def server_specs(settings, facts, visible_devices_env: str | None, options: dict,
                 free_port: Callable[[], int], cores=None) -> list[ServerSpec]:
    """One ``ServerSpec`` per local server: its port (``server_port`` + i, or a free one), tensor-parallel size,
    environment (the device's variables, the KV cache size where the device sizes it in GiB, and the server's
    visible devices from ``server_devices``) and command line, on ``rollout.vllm.host`` with the development and
    RL routes on (the weight wire's verbs need them); with ``cores`` (a ``cores.CorePlan`` that places the
    servers), its cores and its workers' threads."""
    env = dict(facts.env)
    if options.get("enable_lora"):
        env[RUNTIME_LORA_ENV] = "1"  # the adapter-loading routes
    if facts.kv_cache_env and settings.kv_cache_gib is not None:
        env[facts.kv_cache_env] = f"{settings.kv_cache_gib:g}"
    specs = []
    for index in range(local_servers(settings)):
        server_env = dict(env)
        if settings.server_devices and visible_devices_env:
            server_env[visible_devices_env] = str(settings.server_devices[index])
        port = settings.server_port + index if settings.server_port else free_port()
        placed = list(cores.server_cores[index]) if cores is not None and cores.server_cores else []
        if placed:
            server_env["OMP_NUM_THREADS"] = str(cores.server_threads)
        specs.append(ServerSpec(port, settings.tensor_parallel_size, cli_arguments(options), server_env, placed,
                                host=settings.host, dev_mode=True))
    return specs
