"""``rollout.vllm.*``: the settings of ``rollout.engine=vllm`` and their checks, without importing vLLM.

The config check runs in the launching process before any worker starts: a missing vLLM is named there with the
package this device needs (the backend's ``inference_engine_facts().package``), and so are a tensor-parallel
size that does not divide the ranks, a context shorter than the longest sequence, an architecture vLLM cannot
load and ``LLM(...)`` arguments that the engine sets itself; and settings that would do nothing under the chosen
engine, mode or device (``inert_problems``). vLLM's refusal to start for lack of memory becomes one line naming
the setting that sizes it (``memory_refusal``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")
WEIGHT_SYNC_MODES = ("full", "delta")  # engine/rollout/weight_delta.py
# LLM(...) arguments the engine sets itself: passing them through would break the colocation or the sampling.
MANAGED_ARGS = {
    "model": "model.path", "tokenizer": "model.path", "skip_tokenizer_init": None,
    "distributed_executor_backend": None, "tensor_parallel_size": "rollout.vllm.tensor_parallel_size",
    "dtype": "rollout.vllm.dtype", "max_model_len": "rollout.vllm.max_model_len",
    "enforce_eager": "rollout.vllm.enforce_eager", "gpu_memory_utilization": "rollout.vllm.gpu_memory_utilization",
    "seed": "train.seed", "logprobs_mode": None, "generation_config": None, "enable_sleep_mode": None,
    "load_format": None, "enable_lora": "rollout.vllm.lora_sync", "max_lora_rank": "engine.lora_rank",
}


@dataclasses.dataclass
class VLLMConfig:
    tensor_parallel_size: int = 1  # consecutive ranks share one engine (and their prompts); must divide the ranks
    gpu_memory_utilization: float = 0.3  # the device share vLLM may take (weights + KV cache), where sized by share
    kv_cache_gib: float | None = None  # the KV cache in GiB where the device sizes it so (the CPU); null: as set
    max_model_len: int | None = None  # null: the longest prompt allowed + rollout.max_new_tokens
    enforce_eager: bool = True  # no graph capture or compilation: starts in seconds; false on GPUs for speed
    dtype: str | None = None  # null: the dtype the trainer computes in (its weights are pushed in that dtype)
    llm_args: dict = dataclasses.field(default_factory=dict)  # other LLM(...) arguments, passed as they are
    # A LoRA policy's updates (engine.lora_rank > 0): merged (the whole model, adapter folded in, after every update),
    # adapter (vLLM serves the base with LoRA; the adapter alone after every update), auto (engines/lora_sync.py).
    lora_sync: str = "auto"
    # What each push carries (engine/rollout/weight_delta.py): full (every tensor whole), delta (only the elements
    # whose bits changed since the engine's last copy, as indices and values; a tensor whole where that is smaller;
    # the first push after a start or a server's restart whole). Costs a copy of the model on each sending rank (and,
    # in servers, on each worker).
    weight_sync: str = "full"
    # Server mode (engine/rollout/vllm_server): vLLM in separate servers, reached over HTTP, weights pushed over
    # the device's collective library (the backend's weight group, DeviceBackend.new_weight_group).
    mode: str = "colocate"  # colocate: an engine in every trainer rank; server: separate vLLM servers
    servers: int | None = None  # local servers the run starts and stops (null: 1, or 0 when server_urls are given)
    server_urls: list = dataclasses.field(default_factory=list)  # running servers' base URLs (http://host:port)
    server_port: int = 0  # the first local server's port, the next ones follow; 0: free ports
    # the address the local servers listen on: 127.0.0.1 (this machine only); another (0.0.0.0: every interface)
    # exposes them, each still wanting the run's key (docs/security.md, "What listens where")
    host: str = "127.0.0.1"
    server_devices: list = dataclasses.field(default_factory=list)  # each local server's visible devices ("2,3")
    server_args: dict = dataclasses.field(default_factory=dict)  # other api_server arguments (--key value)
    server_start_timeout_s: float = 600.0  # how long local servers may take to answer /health
    weight_transfer_address: str | None = None  # where servers reach the trainer for weights (null: 127.0.0.1)
    # The servers' weight-transfer engine; null: the device's (this package's "accel" on every built-in device);
    # another name: an engine whose trainer half vLLM ships (vLLM's "nccl" on NVIDIA GPUs).
    weight_transfer: str | None = None
    # Servers on the trainer's own CPU cores idle between batches: intra-op threads each trainer process adds then
    # (and gives back while a request is in flight; engine/runtime/borrowed_threads.py). auto: the servers' cores
    # where this run starts them on the trainer's host and the trainer computes on host threads, the two bound
    # apart (engine/rollout/vllm_server/cores.py); else 0. A number: that many, no binding. 0: never.
    borrow_threads: int | str = "auto"


def quiet_vllm_logging() -> None:
    """vLLM's own log at errors only, unless ``VLLM_LOGGING_LEVEL`` is set: its INFO lines and the warnings that do
    not apply to a colocated engine without a tokenizer (a chat-template warm-up traceback at start, a note on
    every weight push) would drown the trainer's output. Set before vLLM is imported (the variable) and after
    (its logger), since rank 0 may have imported it already for the config check."""
    if "VLLM_LOGGING_LEVEL" in os.environ:
        return
    os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
    logging.getLogger("vllm").setLevel(logging.ERROR)


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def missing_vllm_message(package: str) -> str:
    return (f"rollout.engine=vllm needs vLLM, which is not installed in this Python: install {package}, or choose "
            "rollout.engine=hf-continuous")


KV_CACHE_INSTEAD = "rollout.vllm.kv_cache_gib (on this device vLLM's memory is its KV cache, in GiB)"


def enumeration_problems(settings: VLLMConfig) -> list[str]:
    """``rollout.vllm.mode`` and ``rollout.vllm.dtype`` outside their choices, whatever the rollout engine."""
    from accel_backends.names import not_one_of

    from ..vllm_server.settings import MODES

    problems = []
    if settings.mode not in MODES:
        problems.append(not_one_of("rollout.vllm.mode", settings.mode, MODES))
    if settings.weight_sync not in WEIGHT_SYNC_MODES:
        problems.append(not_one_of("rollout.vllm.weight_sync", settings.weight_sync, WEIGHT_SYNC_MODES))
    if settings.dtype is not None and settings.dtype not in DTYPES:
        problems.append(f"rollout.vllm.dtype must be one of {', '.join(DTYPES)} or null (the trainer's compute "
                        f"dtype), got {settings.dtype!r}")
    return problems


def inert_problems(rollout, facts) -> list[str]:
    """Rollout settings that would do nothing under the chosen engine, mode or device, each refused in one line
    saying what it needs: ``rollout.vllm.*`` without ``rollout.engine=vllm``, ``rollout.partial`` without
    staleness, a vLLM memory setting this device does not size vLLM by (``facts``: the backend's
    ``inference_engine_facts()``)."""
    settings, problems = rollout.vllm, []
    if rollout.engine != "vllm":
        problems += enumeration_problems(settings)  # a typo is named as a typo, whatever the engine
        defaults, named = VLLMConfig(), {p.split()[0] for p in problems}
        changed = [f"rollout.vllm.{f.name}={_value(getattr(settings, f.name))}" for f in dataclasses.fields(VLLMConfig)
                   if getattr(settings, f.name) != getattr(defaults, f.name) and f"rollout.vllm.{f.name}" not in named]
        if changed:
            problems.append(f"{', '.join(changed)}: rollout.vllm.* applies only with rollout.engine=vllm (this run "
                            f"has rollout.engine={rollout.engine}): add rollout.engine=vllm, or remove "
                            + ("it" if len(changed) == 1 else "them"))
    else:
        if not facts.memory_fraction and settings.gpu_memory_utilization != VLLMConfig.gpu_memory_utilization:
            problems.append("rollout.vllm.gpu_memory_utilization does not apply on this device (vLLM's memory here "
                            f"is not a share of a device): set {KV_CACHE_INSTEAD} instead")
        if facts.kv_cache_env is None and settings.kv_cache_gib is not None:
            problems.append("rollout.vllm.kv_cache_gib does not apply on this device (vLLM takes a share of the "
                            "device's memory): set rollout.vllm.gpu_memory_utilization instead")
    if rollout.partial is True and rollout.max_staleness == 0:
        problems.append("rollout.partial=true lets requests in flight go on across a weight push, which happens "
                        "only when sampling runs ahead: it needs rollout.max_staleness >= 1 (vLLM servers); set "
                        "rollout.max_staleness or remove rollout.partial")
    return problems


def _value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def memory_refusal(exc: BaseException, arguments: dict) -> str | None:
    """vLLM's refusal to start for lack of memory as one line naming the setting that sizes it, or None for any
    other error (``arguments``: the ``LLM(...)`` arguments it was given)."""
    text = " ".join(str(exc).split())
    if "memory" not in text.lower() or "utilization" not in text.lower():
        return None
    if "gpu_memory_utilization" in arguments:
        fix = (f"lower rollout.vllm.gpu_memory_utilization (now {arguments['gpu_memory_utilization']}) or free "
               "device memory")
    else:
        fix = f"size it with {KV_CACHE_INSTEAD}, e.g. rollout.vllm.kv_cache_gib=1"
    return f"vLLM refused to start for lack of memory ({text}): {fix}"


def check_settings(settings: VLLMConfig, world_size: int, longest_sequence: int | None, facts=None) -> list[str]:
    """Problems with ``rollout.vllm.*`` (types included), as sentences. ``longest_sequence``: the prompt limit +
    ``rollout.max_new_tokens`` when the prompt limit is known before any data is read."""
    problems = []
    tp = settings.tensor_parallel_size
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        problems.append(f"rollout.vllm.tensor_parallel_size must be a positive integer, got {tp!r}")
    elif world_size % tp and settings.mode != "server":  # a server's tensor-parallel group is its own
        problems.append(f"rollout.vllm.tensor_parallel_size={tp} does not divide the {world_size} ranks: each "
                        f"engine spans {tp} consecutive ranks; choose a divisor of {world_size} or change nproc")
    share = settings.gpu_memory_utilization
    if not isinstance(share, (int, float)) or not 0 < share <= 1:
        problems.append(f"rollout.vllm.gpu_memory_utilization must be in (0, 1], got {share!r}")
    if settings.kv_cache_gib is not None and not settings.kv_cache_gib > 0:
        problems.append(f"rollout.vllm.kv_cache_gib must be > 0 or null, got {settings.kv_cache_gib!r}")
    length = settings.max_model_len
    if length is not None:
        if not isinstance(length, int) or length < 1:
            problems.append(f"rollout.vllm.max_model_len must be a positive integer or null, got {length!r}")
        elif longest_sequence is not None and length < longest_sequence:
            problems.append(f"rollout.vllm.max_model_len={length} is shorter than the longest sequence, "
                            f"{longest_sequence} tokens (prompt limit + rollout.max_new_tokens): raise it to at "
                            f"least {longest_sequence} or leave it null")
    problems += [p for p in enumeration_problems(settings) if p.startswith(("rollout.vllm.dtype",
                                                                            "rollout.vllm.weight_sync"))]
    if not isinstance(settings.enforce_eager, bool):
        problems.append(f"rollout.vllm.enforce_eager must be true or false, got {settings.enforce_eager!r}")
    if not isinstance(settings.llm_args, dict):
        problems.append(f"rollout.vllm.llm_args must be a mapping of LLM(...) arguments, got {settings.llm_args!r}")
    else:
        for key in sorted(set(settings.llm_args) & set(MANAGED_ARGS)):
            instead = MANAGED_ARGS[key]
            if key == "gpu_memory_utilization" and facts is not None and not facts.memory_fraction:
                instead = KV_CACHE_INSTEAD
            problems.append(f"rollout.vllm.llm_args.{key} is set by the engine itself"
                            + (f": use {instead}" if instead else ": remove it"))
    return problems


def check_architecture(model_path: str) -> list[str]:
    """A model directory whose architecture this vLLM cannot load (vLLM imported: call only when installed)."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return []  # check_model_dir says so
    try:
        architectures = json.loads(config_file.read_text()).get("architectures") or []
    except json.JSONDecodeError:
        return []
    quiet_vllm_logging()
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    if architectures and not set(architectures) & supported:
        return [f"model.path {model_path}: vLLM cannot load architecture {', '.join(architectures)} (not among the "
                f"{len(supported)} it supports): choose rollout.engine=hf-continuous for this model"]
    return []


def head_size(model_config) -> int | None:
    """The attention head size of ``model.*``: the built-in model's (4 heads), or a directory's ``config.json``."""
    path = model_config.path
    if path and str(path).startswith("builtin:"):
        return model_config.hidden_size // 4  # engine/tiny_model.py: 4 attention heads
    try:
        fields = json.loads((Path(path) / "config.json").read_text())
    except (OSError, TypeError, json.JSONDecodeError):
        return None  # check_model_dir says what is wrong with the directory
    fields = fields.get("text_config", fields)
    if fields.get("head_dim"):
        return int(fields["head_dim"])
    if fields.get("hidden_size") and fields.get("num_attention_heads"):
        return int(fields["hidden_size"]) // int(fields["num_attention_heads"])
    return None


def check_head_size(model_config, minimum: int) -> list[str]:
    """A model whose attention heads are smaller than this device's engine kernels take."""
    size = head_size(model_config)
    if not minimum or size is None or size >= minimum:
        return []
    if str(model_config.path).startswith("builtin:"):
        fix = f"set model.hidden_size={4 * minimum} or more (the built-in model has 4 heads)"
    else:
        fix = "choose rollout.engine=hf-continuous for this model"
    return [f"rollout.engine=vllm: the model's attention heads have {size} dimensions, and vLLM on this device "
            f"takes {minimum} or more: {fix}"]


def vllm_problems(config, world_size: int, longest_sequence: int | None, facts) -> list[str]:
    """Everything wrong with ``rollout.engine=vllm`` for ``config`` (a ``GRPOConfig``), before any worker starts.
    ``facts``: the backend's ``inference_engine_facts()`` (for the package to name)."""
    from engine.rollout.vllm_server.device_guard import server_guard_problems
    from engine.rollout.vllm_server.settings import is_own_engine, server_problems, transfer_engine

    from .lora_sync import problems as lora_sync_problems

    settings = config.rollout.vllm
    problems = check_settings(settings, world_size, longest_sequence, facts) + server_problems(settings, facts)
    problems += server_guard_problems(settings, world_size)  # shared devices, the vLLM version
    own_wire = settings.mode != "server" or is_own_engine(transfer_engine(settings, facts))
    problems += lora_sync_problems(settings.lora_sync, int((config.engine or {}).get("lora_rank", 0) or 0), own_wire)
    if settings.weight_sync == "delta" and not own_wire:
        problems.append("rollout.vllm.weight_sync=delta needs this package's weight-transfer engine (deltas travel "
                        "over its weight group): leave rollout.vllm.weight_transfer null, or use weight_sync=full")
    problems += check_head_size(config.model, facts.min_head_size)
    if settings.mode == "server" and isinstance(settings.borrow_threads, int) and settings.borrow_threads > 0:
        from engine.runtime import borrowing_problem, threads_per_worker, usable_cores

        base = int(os.environ.get("OMP_NUM_THREADS") or threads_per_worker(world_size))
        problems += [p for p in [borrowing_problem(settings.borrow_threads, base, usable_cores(),
                                                   "rollout.vllm.borrow_threads")] if p]
    if settings.mode == "server" and settings.borrow_threads == "auto":
        from engine.rollout.vllm_server.cores import binding_problem

        problems += [p for p in [binding_problem()] if p]
    if settings.mode == "server" and settings.server_urls and not problems:
        from engine.rollout.vllm_server.settings import unreachable_servers

        return unreachable_servers(settings.server_urls)  # the servers have their own vLLM
    if not vllm_installed():
        return [missing_vllm_message(facts.package)] + problems
    if not problems and config.model.path and not str(config.model.path).startswith("builtin:"):
        problems += check_architecture(config.model.path)
    return problems
