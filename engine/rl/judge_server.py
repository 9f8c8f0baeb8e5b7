"""``reward_model.judge_model``: a model directory served by a vLLM server that the run starts before its first step
and stops at its end, then judged through exactly as ``reward_model.judge_url`` is (``judge.py``).

Rank 0 starts it with the rollout servers' launcher (``engine/rollout/vllm_server/manager.py``): the server runs
under that package's guard in a process group of its own, so it ends with the run whether the run finishes, fails,
is interrupted or is killed (the guard's parent-death signal). Every rank reaches it by the URL rank 0 sends. The
server is vLLM's OpenAI-compatible chat server with the model's own tokenizer and chat template; its host, port,
start timeout, context length, KV cache and other arguments are ``reward_model.judge_*`` keys (``reward_model.py``).
It listens on ``reward_model.judge_host`` (127.0.0.1 by default), wants the key its manager draws on every path,
and runs without vLLM's development routes (the judge needs the chat and model routes alone).
"""

from __future__ import annotations

import tempfile

from ..rollout.vllm_server.manager import ServerManager, ServerSpec, cli_arguments
from ..runtime import OneLineError, at_group_end


def judge_server_options(section, facts) -> dict:
    """The api_server options of the judge: eager and seeded; where the device sizes vLLM by a share of its memory,
    the share rollout servers take by default (the trainer shares the device); the device's own arguments, then
    ``reward_model.judge_server_args`` (which win)."""
    from ..rollout.engines.vllm_settings import VLLMConfig

    options = {"enforce_eager": True, "seed": 0, "generation_config": "vllm",
               "max_model_len": section.judge_max_model_len}
    if facts.memory_fraction:
        options["gpu_memory_utilization"] = VLLMConfig.gpu_memory_utilization
    options.update(facts.engine_args)
    options.update(section.judge_server_args)
    return options


def judge_server_spec(section, facts, free_port) -> ServerSpec:
    """Its host (``reward_model.judge_host``), port (``reward_model.judge_port``, or a free one) and environment
    (the device's variables, the KV cache where the device sizes it in GiB); no development routes."""
    env = dict(facts.env)
    if facts.kv_cache_env and section.judge_kv_cache_gib is not None:
        env[facts.kv_cache_env] = f"{section.judge_kv_cache_gib:g}"
    return ServerSpec(section.judge_port or free_port(), arguments=cli_arguments(judge_server_options(section, facts)),
                      env=env, host=section.judge_host, dev_mode=False)


def start_judge_server(section, facts) -> tuple[str, ServerManager]:
    """Start the judge in this process and wait until it answers; ``(its /v1 URL, its manager)`` (the manager holds
    its key). The manager stops it at exit (and the guard if this process dies); a server that fails to start is
    named with its log."""
    from accel_backends.spawn import free_port

    manager = ServerManager(section.judge_model, [judge_server_spec(section, facts, free_port)],
                            tempfile.mkdtemp(prefix="accel-judge-server-"), section.judge_start_timeout_s,
                            remove_logs=True)
    try:
        (url,) = manager.start()
    except OneLineError as exc:
        raise OneLineError(f"reward_model.judge_model: {exc}") from None
    return url + "/v1", manager


def served_judge_url(section, backend) -> tuple[str, str]:
    """The judge's URL and key on every rank: rank 0 starts the server (stopped when this rank's work ends) and
    sends both over the trainer's own group (or, when it could not start, the reason, which every rank raises)."""
    import torch.distributed as dist

    grouped = dist.is_initialized() and dist.get_world_size() > 1
    answer = [None]
    if not grouped or dist.get_rank() == 0:
        try:
            url, manager = start_judge_server(section, backend.inference_engine_facts())
            at_group_end(manager.stop)
            answer = [("url", (url, manager.api_key))]
        except Exception as exc:
            if grouped:  # the other ranks stop too, rather than wait for a URL until the group's timeout
                dist.broadcast_object_list([("error", f"rank 0 could not start it: {exc}")], src=0)
            raise
    if grouped:
        dist.broadcast_object_list(answer, src=0)
    kind, value = answer[0]
    if kind == "error":
        raise OneLineError(f"reward_model.judge_model: {value}")
    return value
