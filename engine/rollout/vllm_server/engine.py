"""``rollout.engine=vllm`` with ``rollout.vllm.mode=server``: sampling in separate vLLM servers, over HTTP.

Rank 0 starts the local servers (``rollout.vllm.servers``, ``manager.py``) or takes running ones
(``rollout.vllm.server_urls``) and tells every rank their URLs; every rank sends its own prompts, spread over the
servers, as token ids and gets token ids and the sampled tokens' log-probs back (``/inference/v1/generate``; the
same sampling parameters as the colocated engine, a seed per prompt). After every update the policy's weights go
to the servers over the device backend's weight group (``pusher.py``, ``weight_wire.py``): rank 0 sends, every
rank gathers one sharded unit at a time, LoRA merged. Synchronous: a push finishes, and every server reports its
version, before any rank samples again (staleness 0). With ``rollout.max_staleness`` > 0 a sampler thread per rank calls
``sample`` while the trainer trains (``engine/rollout/sampling_ahead.py``); a push then pauses the servers in mode
``keep`` (``rollout.partial``: requests in flight go on with the new weights) or ``wait`` (they finish first).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engine.rollout.engines import lora_sync
from engine.rollout.engines import vllm_shared as shared
from engine.rollout.engines.base import Responses, RolloutEngine, SamplingConfig
from engine.rollout.engines.registry import RolloutEngineError

from .client import ServerClient
from .cores import this_host_plan
from .manager import ServerManager
from .model_signature import signature_of
from .plan import server_options, server_specs
from .pusher import WeightPusher
from .settings import is_own_engine, local_servers, transfer_engine
from .vllm_wire import VLLMTrainerWire

MAX_REQUESTS_IN_FLIGHT = 64  # per rank: enough for a server to batch, few enough threads


class VLLMServerRolloutEngine(RolloutEngine):
    receives_weights = True

    def __init__(self, context) -> None:
        super().__init__(context)
        policy = context.policy
        self.settings = context.config.vllm
        self.facts = policy.backend.inference_engine_facts()
        self.rank, self.world_size = policy.rank, policy.world_size
        self.manager: ServerManager | None = None
        # rollout.vllm.borrow_threads: the cores of the servers this run starts and the threads the trainer borrows
        self.core_plan = this_host_plan(self.settings, policy.backend)
        model_dir, load_format = shared.model_directory(context, self.rank)
        self.expected = shared.expected_weights(model_dir)
        engine = transfer_engine(self.settings, self.facts)
        self.lora_rank = shared.lora_rank_of(policy)
        servers = max(len(self.settings.server_urls) or local_servers(self.settings), 1)
        decoded = context.decoded_tokens and context.decoded_tokens * self.world_size // servers  # per server
        self.serves_adapter = shared.choose_lora_sync(self.settings, self.lora_rank, self.expected, decoded,
                                                      own_wire=is_own_engine(engine)) == "adapter"
        urls = None
        if self.rank == 0:
            urls = (list(self.settings.server_urls) or self._start_servers(model_dir, load_format),
                    secrets.token_hex(4),  # this run's adapters' names, unlike any other trainer's on the servers
                    self.manager.api_key if self.manager else None)  # None: the user's servers (VLLM_API_KEY)
        urls, session, key = _from_rank_0(urls)  # over the trainer's own group: the key never leaves the job
        self.clients = [ServerClient(url, self.settings.server_start_timeout_s, api_key=key) for url in urls]
        workers = [self._workers(client) for client in self.clients] if self.rank == 0 else [0] * len(urls)
        from transformers import AutoConfig

        wire = None
        if not is_own_engine(engine):  # an engine with its own trainer side (vLLM's, a third party's)
            wire = VLLMTrainerWire(engine, self.facts.weight_transfer_settings, self.rank,
                                   draw=policy.iter_full_weights)
        self.pusher = WeightPusher(self.clients, workers, self.settings.weight_transfer_address or "127.0.0.1",
                                   signature_of(AutoConfig.from_pretrained(model_dir)), sender=self.rank == 0,
                                   engine=engine, settings=self.facts.weight_transfer_settings,
                                   pause_mode=pause_mode(context.config), wire=wire, backend=policy.backend,
                                   lora_rank=self.lora_rank if self.serves_adapter else 0, session=session,
                                   weight_sync=self.settings.weight_sync)
        self.pusher.connect()

    # -- servers ------------------------------------------------------------------------------------------------

    def _start_servers(self, model_dir: Path, load_format: str) -> list[str]:
        from accel_backends.spawn import free_port

        policy = self.context.policy
        dtype = shared.DTYPE_NAMES.get(getattr(policy, "compute_dtype", torch.float32), "float32")
        options = server_options(self.settings, self.facts, dtype, load_format, self.context.max_sequence_tokens,
                                 lora_rank=self.lora_rank if self.serves_adapter else 0)
        specs = server_specs(self.settings, self.facts, policy.backend.visible_devices_env, options, free_port,
                             self.core_plan)
        log_dir = tempfile.mkdtemp(prefix="accel-vllm-servers-")  # named in any error about a server
        self.manager = ServerManager(model_dir, specs, log_dir, self.settings.server_start_timeout_s,
                                     remove_logs=True)
        return self.manager.start()

    def _workers(self, client: ServerClient) -> int:
        """The server's workers (tensor x pipeline parallel): its weight group's members after the trainer."""
        answer = client.call("GET", "/get_world_size", query={"include_dp": "false"})
        return int(answer["world_size"] if isinstance(answer, dict) else answer)

    def close(self) -> None:
        if self.manager is not None:
            self.manager.stop()
            self.manager = None
            shutil.rmtree(self.pusher.adapter_root, ignore_errors=True)  # this host's servers wrote it
        elif self.rank == 0:
            self.pusher.unload_adapters()  # running servers outlive the run: its adapters do not

    # -- sampling -----------------------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> Responses:
        self.pusher.check_version()
        seed = int(torch.randint(0, shared.SEED_RANGE, (1,)).item())  # the trainer seeds torch per rank and step
        return self.sample(prompts, sampling, seed)[0]

    def sample(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> tuple[Responses, list]:
        """The responses and each row's weight-version spans (``{"version", "start", "end"}`` over its tokens),
        without the version check: the sampler thread of ``rollout.max_staleness`` > 0 calls it while pushes go
        on (HTTP only, no collective)."""
        fields = shared.sampling_fields(sampling)
        seeds = shared.request_seeds(seed, len(prompts), sampling.n)

        def one(index: int) -> list[dict]:
            client = self.clients[(index + self.rank) % len(self.clients)]
            adapter = self.pusher.adapter if self.serves_adapter else None  # the newest, when the request goes
            choices = client.generate(prompts[index], {**fields, "seed": seeds[index]}, model=adapter)
            return [adapter_spans(choice, adapter) for choice in choices] if adapter else choices

        with ThreadPoolExecutor(max_workers=max(1, min(MAX_REQUESTS_IN_FLIGHT, len(prompts)))) as pool:
            choices = [choice for answer in pool.map(one, range(len(prompts))) for choice in answer]
        return responses_from_choices(choices, sampling), [choice.get("weight_versions") for choice in choices]

    @property
    def push_stats(self):
        """The last push's bytes on the wire and changed share (``rollout.vllm.weight_sync=delta``; else None)."""
        return self.pusher.stats

    @property
    def weight_version(self) -> str:
        """The label of the last push (what the servers give every token they sample now)."""
        return str(self.pusher.version)

    # -- weights ------------------------------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push under the next version; every rank waits until the servers have it before sampling again. Every
        rank first reaches the push: a rank's own request still in flight when rank 0 pauses the servers would be
        held until the push ends, while the push needs that rank for the gathers (a deadlock). Requests of the
        sampler threads (``rollout.max_staleness`` > 0) take no part in collectives and may be held."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()
        self.pusher.push(self._checked(weights) if self.rank == 0 else weights)
        if self.world_size > 1:
            dist.barrier()
        self.needs_base_weights = False  # lora_sync=adapter: the base once, then adapters

    def load_adapter(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The adapter's next version over the weight group, loaded by every server under its name (``pusher.py``);
        the same barriers, pause and failure rule as ``load_weights``."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()
        self.pusher.push(tensors, adapter=lora_sync.adapter_config(self.context.policy.lora_config))
        if self.world_size > 1:
            dist.barrier()

    def _checked(self, weights) -> Iterator[tuple[str, torch.Tensor]]:
        """Names and shapes checked before each tensor goes, and none missing before the push is closed."""
        checked = shared.CheckedWeights(weights, self.expected)
        yield from checked
        missing = checked.missing()
        if missing:
            raise RolloutEngineError(f"rollout engine 'vllm' received no weight for {', '.join(missing[:3])}"
                                     f"{' and others' if len(missing) > 3 else ''}")


def adapter_spans(choice: dict, adapter: str) -> dict:
    """A choice sampled with a LoRA adapter: all its tokens from that adapter's version (a request keeps the adapter
    it named, whatever was pushed while it decoded), whatever label the server's base weights carry."""
    version = str(lora_sync.version_of(adapter))
    return {**choice, "weight_versions": [{"version": version, "start": 0, "end": len(choice["token_ids"])}]}


def pause_mode(rollout_config) -> str:
    """How a push pauses the servers: ``keep`` (requests in flight go on with the new weights) with
    ``rollout.partial``, and when synchronous (nothing is in flight then); else ``wait`` (they finish first)."""
    partial = getattr(rollout_config, "partial", False)
    return "keep" if partial or not getattr(rollout_config, "max_staleness", 0) else "wait"


def _from_rank_0(value):
    """``value`` as rank 0 has it, on every rank."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def responses_from_choices(choices: list[dict], sampling: SamplingConfig) -> Responses:
    """The servers' choices (``n`` per prompt, in prompt order) as right-padded ``Responses``."""
    width = max([len(c["token_ids"]) for c in choices] + [1])
    ids = torch.zeros(len(choices), width, dtype=torch.long)
    mask = torch.zeros(len(choices), width, dtype=torch.long)
    want_log_probs = sampling.log_probs and not sampling.greedy
    log_probs = torch.zeros(len(choices), width) if want_log_probs else None
    for row, choice in enumerate(choices):
        tokens = choice["token_ids"]
        ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, :len(tokens)] = 1
        if log_probs is not None:
            log_probs[row, :len(tokens)] = torch.tensor([entry["logprob"] for entry in choice["logprobs"]["content"]])
    return Responses(token_ids=ids, mask=mask, tokens_computed=int(mask.sum()), log_probs=log_probs)
