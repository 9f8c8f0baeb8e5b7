"""``vllm``: vLLM colocated with the trainer, one engine per rank (or per tensor-parallel group) in the trainer's
own processes (``distributed_executor_backend="external_launcher"``: no Ray, no server).

vLLM is imported when this engine is built, never when it is registered. The engine starts from the policy's
model directory; a model without one (the built-in demo model, a checkpoint) is described to vLLM by its
``config.json`` alone, in a scratch directory, with dummy weights that the first weight push replaces. Prompts go
in as token ids and responses come back as token ids with their log-probs under the sampling distribution
(``logprobs_mode="processed_logprobs"``: temperature, top-k and top-p applied, as ``base.sampling_scores``).
The model's ``generation_config.json`` is never read (``generation_config="vllm"``): only the ``SamplingConfig``
applies.

After every update the policy's weights arrive one tensor at a time (``FSDPEngine.iter_full_weights``, LoRA
merged; with ``rollout.vllm.lora_sync=adapter`` the base weights once and then only the adapter, loaded as a new
versioned LoRA adapter through vLLM's own ``add_lora``, the previous one removed: ``lora_sync.py``) and are copied
into the engine in place: each is checked against the model's names and shapes first, so
a tensor the engine cannot take is an error naming it. The prefix cache is reset after a push; the engine never
reloads weights from disk (it would sample from the base model from then on). With ``rollout.vllm.weight_sync=delta``
each rank keeps the engine's copy of the weights in the trainer's naming (``weight_delta.SentCopy``): each new tensor
is compared with it bit by bit and only the changed elements are written into it (``push_stats``: their bytes), and
vLLM's loader takes the updated copy (its own parameters may be merged or repacked, so it takes whole tensors).
How weights are replaced, whether the engine can sleep during the update and how its memory is sized are the device
backend's facts (``DeviceBackend.inference_engine_facts``); nothing here names a device.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ..weight_delta import SentCopy
from . import lora_sync
from .base import Responses, RolloutEngine, SamplingConfig
from .registry import RolloutEngineError
from .vllm_settings import VLLMConfig, memory_refusal, missing_vllm_message, quiet_vllm_logging
from .vllm_shared import (  # noqa: F401  (request_seeds: importable from here as before)
    DTYPE_NAMES,
    SEED_RANGE,
    CheckedWeights,
    choose_lora_sync,
    expected_weights,
    lora_rank_of,
    model_directory,
    request_seeds,
    sampling_fields,
    scratch_directory,
)


def tensor_parallel_groups(world_size: int, size: int) -> list[list[int]]:
    """Consecutive ranks in groups of ``size``: each group runs one engine and shares its prompts."""
    return [list(range(start, start + size)) for start in range(0, world_size, size)]


def share_prompts(parts: list[tuple[list[list[int]], int]]) -> tuple[list[list[int]], int, list[slice]]:
    """A tensor-parallel group's prompts, in member order: ``parts`` is each member's ``(prompts, seed)``; returns
    every prompt, the group's seed (its first member's) and each member's slice of the prompts."""
    prompts, slices, start = [], [], 0
    for own, _ in parts:
        prompts += own
        slices.append(slice(start, start + len(own)))
        start += len(own)
    return prompts, parts[0][1], slices


class VLLMRolloutEngine(RolloutEngine):
    receives_weights = True
    _noted_no_sleep = False  # said once per process

    def __init__(self, context, build_llm: Callable[[dict], object] | None = None) -> None:
        super().__init__(context)
        policy = context.policy
        self.settings = getattr(context.config, "vllm", None) or VLLMConfig()
        self.facts = policy.backend.inference_engine_facts()
        self.rank, self.world_size = policy.rank, policy.world_size
        self.group_size = self.settings.tensor_parallel_size
        self.group = None  # the tensor-parallel group's process group, when it has more than one rank
        if self.group_size > 1:
            import torch.distributed as dist

            for members in tensor_parallel_groups(self.world_size, self.group_size):
                created = dist.new_group(members)  # every rank creates every group
                if self.rank in members:
                    self.group = created
        self.sleeping = False
        self.copy = SentCopy() if self.settings.weight_sync == "delta" else None  # the engine's weights, as pushed
        model_dir, load_format = self._model_directory(context)
        self.expected = expected_weights(model_dir)
        self.lora_rank = lora_rank_of(policy)
        decoded = context.decoded_tokens and context.decoded_tokens * self.group_size  # the group's prompts
        self.serves_adapter = choose_lora_sync(self.settings, self.lora_rank, self.expected, decoded) == "adapter"
        self.lora_request = None  # the adapter version sampled from (lora_sync=adapter)
        self.adapter_root = scratch_directory(f"accel-vllm-adapters-{self.rank}-") if self.serves_adapter else None
        arguments = self.llm_arguments(model_dir, load_format)
        for name, value in self.facts.env.items():
            os.environ.setdefault(name, value)
        if self.facts.kv_cache_env and self.settings.kv_cache_gib is not None:
            os.environ[self.facts.kv_cache_env] = f"{self.settings.kv_cache_gib:g}"
        if self.group is not None:  # an earlier job's segments would stop this one: remove them, then build
            import torch.distributed as dist

            _remove(_shared_memory())
            dist.barrier()
        try:
            self.llm = build_llm(arguments) if build_llm else _build_llm(arguments, self.facts.package)
        except Exception as exc:
            refusal = memory_refusal(exc, arguments)  # one line naming the setting that sizes vLLM's memory
            if refusal is None:
                raise
            raise RolloutEngineError(refusal) from None

    # -- start --------------------------------------------------------------------------------------------------

    def _model_directory(self, context) -> tuple[Path, str]:
        return model_directory(context, self.rank)

    def llm_arguments(self, model_dir: Path, load_format: str) -> dict:
        """``LLM(...)``'s arguments: the engine's own, ``rollout.vllm.*`` and its ``llm_args`` pass-through."""
        s, policy = self.settings, self.context.policy
        dtype = s.dtype or DTYPE_NAMES.get(getattr(policy, "compute_dtype", torch.float32), "float32")
        arguments = {
            "model": str(model_dir), "skip_tokenizer_init": True, "load_format": load_format,
            "distributed_executor_backend": "external_launcher", "tensor_parallel_size": s.tensor_parallel_size,
            "dtype": dtype, "enforce_eager": s.enforce_eager, "generation_config": "vllm",
            "logprobs_mode": "processed_logprobs", "seed": 0,
            "enable_sleep_mode": self.facts.sleep_level > 0,
        }
        max_model_len = s.max_model_len or self.context.max_sequence_tokens  # null: the model's own limit
        if max_model_len:
            arguments["max_model_len"] = max_model_len
        if self.facts.memory_fraction:
            arguments["gpu_memory_utilization"] = s.gpu_memory_utilization
        if self.serves_adapter:  # one adapter at a time: synchronous pushes leave no request on the previous one
            arguments.update(enable_lora=True, max_lora_rank=lora_sync.vllm_max_lora_rank(self.lora_rank), max_loras=1)
        arguments.update(self.facts.engine_args)  # what the device needs, e.g. no chunked prefill on the CPU
        arguments.update(s.llm_args)
        return arguments

    # -- sampling -----------------------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> Responses:
        self._wake_fully()
        seed = int(torch.randint(0, SEED_RANGE, (1,)).item())  # the trainer seeds torch per rank and step
        mine = slice(0, len(prompts))
        if self.group is not None:  # the group's engine runs every member's prompts, with one seed
            import torch.distributed as dist

            parts = [None] * self.group_size
            dist.all_gather_object(parts, (prompts, seed), group=self.group)
            prompts, seed, slices = share_prompts(parts)
            mine = slices[dist.get_rank(self.group)]
        try:
            outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts],
                                        self.sampling_params(sampling, len(prompts), seed), use_tqdm=False,
                                        lora_request=self.lora_request)
        except Exception as exc:  # vLLM's own error, said as one line (its traceback means nothing to a user)
            raise RolloutEngineError(f"rollout engine 'vllm' failed to generate: {one_line(exc)}") from None
        return responses_from(outputs[mine], sampling)

    def close(self) -> None:
        """Shut vLLM down now, while the process group it shares still exists (at the interpreter's exit it would
        tear down a group the launcher already destroyed: ``Invalid process group specified``)."""
        llm, self.llm = getattr(self, "llm", None), None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        if getattr(self, "adapter_root", None) is not None:  # lora_sync=adapter: the versions this rank wrote
            shutil.rmtree(self.adapter_root, ignore_errors=True)

    def sampling_params(self, sampling: SamplingConfig, prompts: int, seed: int) -> list:
        """One ``SamplingParams`` per prompt: every ``SamplingConfig`` field, each prompt its own seed."""
        from vllm import SamplingParams

        common = sampling_fields(sampling)
        return [SamplingParams(seed=s, **common) for s in request_seeds(seed, prompts, sampling.n)]

    # -- weights and memory -------------------------------------------------------------------------------------

    @property
    def sleeps(self) -> bool:
        return self.facts.sleep_level > 0

    def release_memory(self) -> None:
        """Sleep during the update where the device has a sleep mode; else keep everything (said once)."""
        if self.facts.sleep_level > 0:
            if not self.sleeping:
                self.llm.sleep(level=self.facts.sleep_level)
                self.sleeping = True
            return
        if self.rank == 0 and not VLLMRolloutEngine._noted_no_sleep:
            VLLMRolloutEngine._noted_no_sleep = True
            print("accel-grpo: note: rollout.engine=vllm keeps its weights and KV cache in memory during updates "
                  "(vLLM has no sleep mode on this device)", file=sys.stderr, flush=True)

    def _wake_fully(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Wake the weights (never push into sleeping memory), push, reset the prefix cache, wake the KV cache."""
        if self.sleeping:
            self.llm.wake_up(tags=["weights"])
        if self.copy is not None:
            weights = self._through_copy(weights)
        checked = CheckedWeights(weights, self.expected)
        try:
            if self.facts.weight_reload == "reload_weights":
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(checked)})
            else:
                self.llm.collective_rpc(_load_into_model, args=(iter(checked),))
        except RolloutEngineError:
            raise
        except Exception as exc:
            raise RolloutEngineError(f"rollout engine 'vllm' failed to take weight {checked.last!r}: "
                                     f"{type(exc).__name__}: {exc}") from exc
        missing = checked.missing()
        if missing:
            raise RolloutEngineError(f"rollout engine 'vllm' received no weight for {', '.join(missing[:3])}"
                                     f"{' and others' if len(missing) > 3 else ''}: its copy would be part old, "
                                     "part new")
        self.llm.reset_prefix_cache()
        if self.sleeping:
            self.llm.wake_up(tags=["kv_cache"])
            self.sleeping = False
        self.needs_base_weights = False  # lora_sync=adapter: the base once; reloading it dropped the adapter
        self.lora_request = None

    @property
    def push_stats(self):
        return self.copy.stats if self.copy is not None else None

    def _through_copy(self, weights: Iterable[tuple[str, torch.Tensor]]):
        """Each tensor's changed elements written into the engine's copy; the copy's tensor goes on to vLLM."""
        self.copy.start()
        for name, tensor in weights:
            self.copy.message(name, tensor)
            yield name, self.copy.copy[name]

    def load_adapter(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The adapter's next version, written as a PEFT directory on this rank's disk and loaded through vLLM's
        ``add_lora`` (which checks it); the previous version is removed from the engine and from the disk."""
        from vllm.lora.request import LoRARequest

        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False
        version = (self.lora_request.lora_int_id if self.lora_request else 0) + 1
        config = lora_sync.adapter_config(self.context.policy.lora_config)
        path = lora_sync.write_adapter(lora_sync.version_directory(self.adapter_root, version),
                                       dict(tensors), config)
        request = LoRARequest(lora_sync.adapter_name(version), version, str(path))
        try:
            self.llm.llm_engine.add_lora(request)
        except Exception as exc:
            raise RolloutEngineError(f"rollout engine 'vllm' failed to load the LoRA adapter: {one_line(exc)}") from exc
        previous, self.lora_request = self.lora_request, request
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        lora_sync.prune(self.adapter_root, keep_from=version)
        self.llm.reset_prefix_cache()


def one_line(exc: BaseException) -> str:
    """An exception as ``Type: first line of its message`` (vLLM's messages can run over many lines)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _shared_memory() -> set[str]:
    """vLLM's CPU collectives' shared-memory segments. A multi-rank group creates them under a name that does not
    change from one job to the next when an external launcher starts vLLM, and they outlive the job: the next one
    then fails (``create shm in SHMManager failed. errno: 17``). A tensor-parallel engine removes them before it
    is built (two jobs on one host could not share them anyway)."""
    import glob

    return set(glob.glob("/dev/shm/*cpushm*"))


def _remove(paths: set[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _load_into_model(worker, weights) -> None:
    """Run on a vLLM worker: the model's own ``load_weights`` (where the worker has no ``reload_weights``)."""
    worker.model_runner.get_model().load_weights(weights=weights)


def _build_llm(arguments: dict, package: str):
    quiet_vllm_logging()
    try:
        from vllm import LLM
    except ImportError as exc:
        raise RolloutEngineError(f"{missing_vllm_message(package)} ({exc})") from None
    return LLM(**arguments)


def responses_from(outputs, sampling: SamplingConfig) -> Responses:
    """vLLM's ``RequestOutput``s (one per prompt, ``n`` completions each) as right-padded ``Responses``."""
    rows = [completion for output in outputs for completion in sorted(output.outputs, key=lambda c: c.index)]
    width = max([len(c.token_ids) for c in rows] + [1])
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    want_log_probs = sampling.log_probs and not sampling.greedy
    log_probs = torch.zeros(len(rows), width) if want_log_probs else None
    for row, completion in enumerate(rows):
        tokens = list(completion.token_ids)
        ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, :len(tokens)] = 1
        if log_probs is not None:
            log_probs[row, :len(tokens)] = torch.tensor(
                [completion.logprobs[t][token].logprob for t, token in enumerate(tokens)])
    return Responses(token_ids=ids, mask=mask, tokens_computed=int(mask.sum()), log_probs=log_probs)
