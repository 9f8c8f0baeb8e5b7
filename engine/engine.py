"""``FSDPEngine``: shard a model, run micro-batched forward/backward, step, offload and checkpoint it.

The engine knows FSDP, models and optimizers; everything about the device comes from the backend it is given
(``accel_backends.get_backend()`` by default), so both fixes below apply the same way on every device:

* offload-aware fast path: with nothing offloaded and the module already in the wanted mode, entering and leaving
  ``train_mode``/``eval_mode`` moves nothing, calls neither ``gc.collect()`` nor ``empty_cache()`` and walks no
  submodule, whatever the depth of the model;
* deferred gradient sync: gradients are reduced once per mini-batch, on its last micro-batch (``fsdp/grad_sync.py``),
  when the unsharded gradients this needs fit the device (``fsdp/sync_plan.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import accel_backends
from accel_backends.names import did_you_mean

from . import checkpoint, events, packing, sequence_parallel
from .config import EngineConfig
from .fsdp import offload, private_state, rank0_loading, sync_plan
from .fsdp.full_weights import unit_weights
from .fsdp.grad_sync import discard_partial_backward, micro_batch_context
from .fsdp.model_prep import lora_adapter, prepare_model
from .fsdp.offload import DEVICE, HOST
from .fsdp.optimizer import build_optimizer, build_scheduler, clip_gradients
from .fsdp.sharding import (
    compute_dtype,
    generation_context,
    generation_is_collective,
    shard_model,
    unwrap,
    wrapper_version,
)
from .runtime import labelled, on_every_rank, phase, start_sum_over_ranks

StepFn = Callable[[nn.Module, Any], Any]


class FSDPEngine:
    """One sharded model with its optimizer and schedule, on one backend. See ``docs/engine.md``."""

    def __init__(self, model: nn.Module | Callable[[], nn.Module] | str | os.PathLike,
                 config: EngineConfig | None = None, backend: accel_backends.DeviceBackend | None = None) -> None:
        config = _as_config(config)
        rank0_loading.check_source(model)
        self.config = config
        self.backend = backend or accel_backends.get_backend()
        self.backend.require_available()
        self.dist_info = self.backend.init_distributed(timeout=self.config.dist_timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.backend.manual_seed(self.config.seed)

        # A path or a factory is built for real on rank 0 only; the other ranks build it on the meta device.
        built, from_rank0 = rank0_loading.build(model, self.rank, self.world_size, self.config.load_on_rank0)
        self.model_config = getattr(built, "config", None)
        self.sequence_parallel = self._sequence_parallel_group(built)
        self.attn_implementation = self._attention_choice()
        prepared = prepare_model(built, self.config, self.attn_implementation)
        if self.config.frozen:
            prepared.requires_grad_(False)  # before sharding, so FSDP knows no gradients are wanted
        trainable = sync_plan.trainable_numel(prepared)
        full_state = expected = None
        if from_rank0 and self.rank == 0:
            full_state = prepared.state_dict()  # references, not copies: rank 0 already holds them
            expected = rank0_loading.fingerprint(prepared.named_parameters())
        self.module, self.num_sharded_units = shard_model(prepared, self.config, self.backend, self.world_size,
                                                          from_rank0=from_rank0)
        # The wrapper actually used: ``config.fsdp_version``, or 0 for a one-rank model run without FSDP.
        self.fsdp_version = wrapper_version(self.config, self.backend, self.world_size)
        self._fsdp2_units = private_state.fsdp2_units(self.module) if self.fsdp_version == 2 else None  # found once
        if from_rank0:
            rank0_loading.receive_from_rank0(self.module, self.fsdp_version, self.backend.device(), full_state)
            del full_state
            rank0_loading.check_received(self.module, self.fsdp_version, expected, self.backend.metrics_device())
        self.loaded_on_rank0 = from_rank0
        self.grad_sync_plan = self._plan_grad_sync(trainable)
        self.grad_sync_mode = self.grad_sync_plan.mode
        if self.config.frozen:
            self.optimizer, self.scheduler = None, None
        else:
            self.optimizer = build_optimizer(self.module, self.config)
            self.scheduler = build_scheduler(self.optimizer, self.config)
        self.global_step = 0  # optimizer steps attempted (skipped ones included)
        self.skipped_steps = 0
        self.last_metrics: dict[str, Any] = {}  # of the last forward_backward_batch
        self.last_step_metrics: dict[str, Any] = {}  # of the last optimizer_step
        self._residency = {"params": DEVICE, "optimizer": DEVICE}
        self._grads_pending = False
        self._mode_stack: list[bool] = []  # the open train_mode (True) / eval_mode (False) contexts
        self._module_training: bool | None = None  # the mode the engine last set on every submodule
        self._update_peak_open = False  # the peak-memory figure already covers this update's onload
        self.packed_input_probe: packing.ProbeResult | None = None  # set by packed_input_supported()
        if self.config.param_offload:
            self.to(HOST, model=True, optimizer=False)
        if self.config.optimizer_offload:
            self.to(HOST, model=False, optimizer=True)

    def _plan_grad_sync(self, trainable_numel: int) -> sync_plan.GradSyncPlan:
        """Decide deferred or per-micro-batch gradient sync from this rank's memory (see ``fsdp/sync_plan.py``)."""
        config = self.config
        needed = sync_plan.deferred_extra_bytes(trainable_numel, self.fsdp_version,
                                                compute_dtype(config, self.backend), self.world_size)
        optimizer_on_device_in_backward = not (config.optimizer_offload and config.optimizer_onload == "step")
        reserved = (sync_plan.optimizer_state_bytes(trainable_numel, self.world_size)
                    if optimizer_on_device_in_backward and not config.frozen else 0)
        decision = sync_plan.plan(config.grad_sync, needed_bytes=needed, reserved_bytes=reserved,
                                  free_bytes=self.backend.memory_stats().free, margin=config.grad_sync_margin)
        sync_plan.log_plan(decision, self.rank)
        return decision

    def _sequence_parallel_group(self, model: nn.Module) -> sequence_parallel.SequenceParallel:
        """This rank's sequence-parallel group (``engine.sequence_parallel``), once the settings, the model and the
        device are known to allow the split: else one line naming each problem."""
        size = self.config.sequence_parallel_size
        problems = [*sequence_parallel.config_problems(size, self.world_size, fsdp_version=self.config.fsdp_version,
                                                       attn_implementation=self.config.attn_implementation),
                    *sequence_parallel.model_problems(size, self.model_config, self.backend.sequence_parallel_facts()),
                    *sequence_parallel.module_problems(size, model)]
        if problems:
            raise ValueError("invalid EngineConfig: " + "; ".join(problems))
        return sequence_parallel.SequenceParallel.create(self.backend, size)

    def _attention_choice(self) -> str:
        """The configured attention implementation, else the backend's (flash kernels need half precision), with
        ``sdpa`` run as ``packed_sdpa`` (the same, but a packed row costs what its sequences cost); ``ulysses``
        (sdpa with the exchange) when sequences are split."""
        if self.sequence_parallel.enabled:
            return sequence_parallel.register_ulysses()
        chosen = self.config.attn_implementation
        if chosen is None:
            chosen = self.backend.attention_implementation(packed=True)
            if chosen.startswith("flash_attention") and compute_dtype(self.config, self.backend) == torch.float32:
                chosen = "sdpa"
            if chosen == "sdpa":
                chosen = packing.PACKED_SDPA
        if chosen == packing.PACKED_SDPA:
            packing.register_packed_sdpa()
        return chosen

    # -- packed input -------------------------------------------------------------------------------------------

    def packed_input_supported(self) -> bool:
        """Whether the model keeps packed sequences apart (one row, positions restarting, no mask), probed once.

        A collective (a forward of the sharded model): call it on every rank alike. The first call runs
        ``engine.packing.probe_packed_input`` in ``eval_mode`` and the ranks agree on the verdict; a "no" is
        warned about once (rank 0), and a trainer then falls back to padded micro-batches.
        """
        if self.packed_input_probe is None:
            vocab_size = getattr(self.model_config, "vocab_size", None)
            if not vocab_size:
                result = packing.ProbeResult(False, float("inf"), 0.0, "the model has no config.vocab_size to probe")
            else:
                with self.eval_mode(), phase("forward"):
                    result = packing.probe_packed_input(self.module, self.backend.device(), int(vocab_size))
            everyone_works = on_every_rank(result.works, self.backend.metrics_device())  # every rank calls it
            if result.works and not everyone_works:
                result = dataclasses.replace(result, works=False, error="another rank's probe failed")
            self.packed_input_probe = result
            if not result.works and self.rank == 0:
                warnings.warn(f"attention implementation {self.attn_implementation!r} cannot take packed sequences "
                              f"({result.describe()}): using padded micro-batches instead", stacklevel=2)
        return self.packed_input_probe.works

    # -- residency ----------------------------------------------------------------------------------------------

    @property
    def is_param_offload_enabled(self) -> bool:
        return self.config.param_offload

    @property
    def is_optimizer_offload_enabled(self) -> bool:
        return self.config.optimizer_offload

    def residency(self) -> dict[str, str]:
        """Where each part lives now: ``{"params": "device" | "cpu", "optimizer": ...}``."""
        return dict(self._residency)

    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> None:
        """Move parameters (with buffers) and/or optimizer state to ``"device"`` or ``"cpu"``.

        Parts already there are not touched. Gradients live with their parameters (torch requires it): ``grad``
        lets existing gradients travel along; ``grad=False`` while gradients exist is an error.
        """
        if device not in (DEVICE, HOST):
            raise ValueError(f"device must be {DEVICE!r} or {HOST!r}, got {device!r}")
        version = self.fsdp_version
        if model and self._residency["params"] != device:
            param_bytes, grad_bytes = offload.model_bytes(self.module, version)
            if grad_bytes and not grad:
                raise ValueError("gradients exist and must move with their parameters: pass grad=True, or call "
                                 "optimizer_step() first")
            seconds = self._timed_move(offload.move_model, self.module, version, self.backend, device)
            self._residency["params"] = device
            events.transfer(self, "params", device, param_bytes, seconds=seconds)
            if grad_bytes:  # they travelled with the parameters, in the same measured time
                events.transfer(self, "grads", device, grad_bytes, seconds=seconds)
        if optimizer and self.optimizer is not None and self._residency["optimizer"] != device:
            num_bytes = offload.optimizer_bytes(self.optimizer)
            seconds = self._timed_move(offload.move_optimizer, self.optimizer, self.backend, device)
            self._residency["optimizer"] = device
            events.transfer(self, "optimizer", device, num_bytes, seconds=seconds)

    def _timed_move(self, move: Callable[..., None], *args: Any) -> float:
        """Run one move (its copies are non-blocking where the backend pins host memory), then synchronise once."""
        start = time.perf_counter()
        move(*args)
        self.backend.synchronize()  # the one wait per move: copies queued above have landed after it
        return time.perf_counter() - start

    @contextlib.contextmanager
    def train_mode(self, disable_auto_offload: bool = False):
        """Train with everything on the device; what is offloaded comes in on entry and goes back on exit.

        With ``optimizer_onload="step"`` offloaded optimizer state stays in host memory here and comes to the
        device only inside ``optimizer_step()``.
        """
        wanted = ("params",) if self.config.optimizer_onload == "step" else ("params", "optimizer")
        with self._mode("train", disable_auto_offload, wanted=wanted):
            yield self

    @contextlib.contextmanager
    def eval_mode(self, disable_auto_offload: bool = False):
        """Forward only (rollouts, log-probs): parameters on the device, optimizer state left where it is."""
        with self._mode("eval", disable_auto_offload, wanted=("params",)):
            yield self

    @contextlib.contextmanager
    def _mode(self, mode: str, disable_auto_offload: bool, wanted: tuple[str, ...]):
        events.mode_switch(self, mode, entering=True)
        try:  # observers get an exit event for every enter event, also when the onload or offload raises
            onload = []
            if not disable_auto_offload:
                offloaded = {"params": self.config.param_offload, "optimizer": self.config.optimizer_offload}
                onload = [p for p in wanted if offloaded[p] and self._residency[p] == HOST]
            # The fast path: with nothing offloaded ``onload`` is empty and no move, gc or cache call happens.
            if onload:
                if mode == "train" and not self._grads_pending:
                    self._start_update_peak()  # the update's peak includes bringing its parts in
                self.to(DEVICE, model="params" in onload, optimizer="optimizer" in onload)
            training = mode == "train"
            self._mode_stack.append(training)
            self._set_module_mode(training)
            try:
                yield
            finally:
                self._mode_stack.pop()
                if self._mode_stack:  # back to the enclosing context's mode (a no-op when it is the same)
                    self._set_module_mode(self._mode_stack[-1])
                if onload:
                    self.to(HOST, model="params" in onload, optimizer="optimizer" in onload)
                    # Moved tensors are freed by reference counting; no gc.collect() is needed (docs/engine.md).
                    self.backend.empty_cache()
        finally:
            events.mode_switch(self, mode, entering=False)

    def _set_module_mode(self, training: bool) -> None:
        """Put every submodule in train or eval mode, walking them only when something may differ.

        The engine remembers the mode it last set on all submodules; the root's own flag reveals a
        ``module.train()``/``eval()`` made behind the engine's back (those recurse from the root), so the common
        case (already in the wanted mode) costs two attribute reads, whatever the depth of the model.
        """
        if self._module_training is training and self.module.training is training:
            return
        self.module.train(training)
        self._module_training = training

    def _start_update_peak(self) -> None:
        """Restart the backend's peak-memory figure for the update that begins now (onload included).

        An update runs from here (or from its ``forward_backward_batch``) to the end of its ``optimizer_step``,
        which reports the peak of all of it.
        """
        self.backend.reset_peak_memory_stats()
        self._update_peak_open = True

    def _peak_gib(self) -> float:
        return (self.backend.memory_stats().peak_allocated or 0) / 2**30

    def _require_on_device(self, what: str, parts: Sequence[str]) -> None:
        away = [p for p in parts if self._residency[p] != DEVICE]
        if away:
            raise RuntimeError(f"{what} needs {' and '.join(away)} on the device, but they are offloaded: call it "
                               "inside engine.train_mode() (or eval_mode() for forward-only work)")

    # -- forward / backward -------------------------------------------------------------------------------------

    def forward_backward_batch(self, micro_batches: Sequence[Any], step_fn: StepFn,
                               forward_only: bool = False) -> dict[str, float]:
        """Run ``step_fn(module, micro_batch)`` over one mini-batch; gradients equal one pass over all of it.

        ``step_fn`` returns the micro-batch's mean loss, or ``(loss, weight)`` or ``(loss, weight, metrics)``
        with ``weight`` its number of tokens or samples. Each micro-batch counts in proportion to its weight
        across all micro-batches and all data-parallel ranks; the weight total is all-reduced once.

        With sequence parallelism the ranks of a group share each micro-batch: each returns its share of the
        micro-batch's loss (the group's shares add up to its mean; ``engine.sequence_parallel``) and the whole
        micro-batch's weight, which counts once per group. Metrics are shares alike.
        """
        micro_batches = list(micro_batches)
        if not micro_batches:
            raise ValueError("forward_backward_batch got no micro-batches: pass a non-empty sequence")
        self._require_on_device("forward_backward_batch", ["params"])
        if not forward_only and self.config.frozen:
            raise RuntimeError("this engine is frozen (a reference model): use forward_only=True")
        if not forward_only and self._grads_pending:
            raise RuntimeError("gradients of an earlier forward_backward_batch are still pending: call "
                               "optimizer_step() before the next mini-batch")
        start = time.perf_counter()
        if not self._update_peak_open:  # else an update is under way: its figure began at train_mode entry
            self.backend.reset_peak_memory_stats()
            self._update_peak_open = not forward_only
        metrics_device = self.backend.metrics_device()
        totals: dict[str, torch.Tensor] = {}
        count = len(micro_batches)
        deferred = self.grad_sync_mode == "deferred"
        if not forward_only:
            self._grads_pending = True
        try:
            for index, micro_batch in enumerate(micro_batches):
                last = index == count - 1
                if forward_only:
                    with torch.no_grad(), phase("forward"):
                        loss, weight, extra = _unpack(step_fn(self.module, micro_batch), metrics_device)
                    pending = self._add_metrics(totals, loss, weight, extra, metrics_device, start_sum=last)
                    continue
                with micro_batch_context(self.module, self.fsdp_version, index, count, deferred=deferred,
                                         keep_unsharded=self.config.keep_params_unsharded, units=self._fsdp2_units):
                    with phase("forward"):
                        loss, weight, extra = _unpack(step_fn(self.module, micro_batch), metrics_device)
                    # Every metric is known once the last forward is done: its all-reduce runs during the backward.
                    pending = self._add_metrics(totals, loss, weight, extra, metrics_device, start_sum=last)
                    with phase("backward"):
                        (loss * weight.to(loss.device, loss.dtype)).backward()
            with phase("metric reduction"):  # keys checked with the sums: a metric on one rank only cannot mix or hang
                reduced = pending.result()
        except BaseException:
            if not forward_only:  # partial gradients of a failed mini-batch are useless: start clean
                try:
                    discard_partial_backward(self.module, self.fsdp_version)
                    self.zero_grad()
                except Exception as cleanup_error:  # noqa: BLE001 - never hide the user's error behind ours
                    warnings.warn(f"could not reset the engine after a failed micro-batch: {cleanup_error!r}",
                                  stacklevel=2)
            raise
        total_weight = reduced.pop("weight") / self.sequence_parallel.size  # each group's ranks gave it alike
        if total_weight <= 0:
            raise ValueError(f"the weights of this mini-batch sum to {total_weight} over all ranks: every "
                             "micro-batch weight must be >= 0 and at least one > 0")
        if not forward_only:
            self._scale_gradients(self.world_size / total_weight)
        metrics = {key: value / total_weight for key, value in reduced.items()}
        metrics.update(weight=total_weight, micro_batches=float(count), time_s=time.perf_counter() - start,
                       peak_memory_gib=self._peak_gib())
        self.last_metrics = metrics
        return metrics

    @staticmethod
    def _add_metrics(totals: dict, loss, weight, extra: Mapping, device, start_sum: bool):
        """Add one micro-batch's weighted loss and metrics to ``totals``; on the last one, start their reduction."""
        _accumulate(totals, "loss", loss.detach().float().to(device) * weight)
        _accumulate(totals, "weight", weight)
        for key, value in extra.items():
            _accumulate(totals, key, torch.as_tensor(value, dtype=torch.float32, device=device) * weight)
        return start_sum_over_ranks(totals, device) if start_sum else None

    def _scale_gradients(self, factor: float) -> None:
        """FSDP averages gradients over ranks; rescale so they weight micro-batches by their share of the total."""
        grads = [offload.local(p.grad) for p in self.module.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, factor)

    # -- optimizer ----------------------------------------------------------------------------------------------

    @labelled("optimizer step")
    def optimizer_step(self) -> float:
        """Clip, step and zero the gradients; return the global gradient norm.

        A non-finite norm skips the step (weights, optimizer state and schedule untouched), zeroes the gradients
        and is reported as ``skipped`` in ``last_step_metrics`` and to ``on_optimizer_step`` observers. With
        ``optimizer_onload="step"`` offloaded optimizer state comes to the device here, and leaves again after.
        ``last_step_metrics["peak_memory_gib"]`` is the peak of the whole update: onload at ``train_mode`` entry,
        forward/backward and this step.
        """
        if self.optimizer is None:
            raise RuntimeError("this engine is frozen (a reference model) and has no optimizer")
        onload = self._optimizer_onload_for_step()
        self._require_on_device("optimizer_step", ["params"] if onload else ["params", "optimizer"])
        lr = self.scheduler.get_last_lr()[0]
        if onload:
            self.to(DEVICE, model=False, optimizer=True)
        try:
            norm = float(clip_gradients(self.module, self.fsdp_version, self.config.max_grad_norm))
            skipped = not math.isfinite(norm)
            if skipped:
                self.skipped_steps += 1
            else:
                self.optimizer.step()
                self.scheduler.step()
            self.zero_grad()
        finally:
            if onload:
                self.to(HOST, model=False, optimizer=True)
                self.backend.empty_cache()
        self.global_step += 1
        self.last_step_metrics = {"step": self.global_step, "grad_norm": norm, "lr": lr, "skipped": skipped,
                                  "peak_memory_gib": self._peak_gib()}
        self._update_peak_open = False
        events.optimizer_step(self, self.global_step, self.last_step_metrics)
        return norm

    def _optimizer_onload_for_step(self) -> bool:
        """Whether this step brings offloaded optimizer state in (``optimizer_onload="step"``) and out again."""
        return (self.config.optimizer_offload and self.config.optimizer_onload == "step"
                and self._residency["optimizer"] == HOST)

    # -- generation ---------------------------------------------------------------------------------------------

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype forward and backward run in, and the one ``iter_full_weights`` yields."""
        return compute_dtype(self.config, self.backend)

    @property
    def generation_is_collective(self) -> bool:
        """Whether every forward inside ``generation_model()`` is a collective (``generate_gather="per_layer"``
        with several ranks): then all ranks must make the same number of forwards, and a rank whose rows finished
        keeps stepping with the others. With the default ``"once"`` ranks decode independently."""
        return generation_is_collective(self.fsdp_version, self.config.generate_gather, self.world_size)

    @contextlib.contextmanager
    def generation_model(self):
        """The model to decode with (the HF or PEFT model given), its sharded units gathered, without gradients.

        Each unit is gathered once for the block and resharded at its end (``generate_gather="once"``), or for
        every forward (``"per_layer"``, less memory; see ``generation_is_collective``). For decode loops of one's
        own (a rollout engine); ``generate`` is HF ``generate`` inside this block.
        """
        self._require_on_device("generation", ["params"])
        with torch.no_grad(), generation_context(self.module, self.fsdp_version, self.config.generate_gather):
            yield unwrap(self.module, self.fsdp_version)

    def generate(self, **kwargs: Any) -> torch.Tensor:
        """Hugging Face ``generate`` on the sharded model (FSDP1 or FSDP2), without gradients.

        Each sharded unit is gathered once per call and resharded at the end (``generate_gather="once"``), or
        for every new token (``"per_layer"``, less memory). ``synced_gpus`` (an all-reduce per new token so that
        ranks step together) defaults to ``generation_is_collective``: off when the whole model is held.
        """
        kwargs.setdefault("synced_gpus", self.generation_is_collective)
        with self.generation_model() as model:
            return model.generate(**kwargs)

    def iter_full_weights(self, merge_lora: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` for every parameter, gathered one sharded unit at a time (a collective: every
        rank must consume the whole iterator).

        What a rollout engine with its own copy of the model loads after an update. Memory stays at one unit: each
        tensor is valid only until the next one is requested (copy it to keep it). Tensors are in the dtype the
        forward computes in. With LoRA and ``merge_lora`` (the default) each base weight comes with its adapter
        folded in (``W + scaling * B @ A``) under the plain model's names (``model.layers.0.mlp.up_proj.weight``),
        and no adapter tensors; ``merge_lora=False`` gives PEFT's own names, adapters included. Parameters offloaded
        to the host are brought in for the call and go back after.
        """
        dtype = compute_dtype(self.config, self.backend)
        adapter = lora_adapter(self.module) if merge_lora else None
        with self.eval_mode():
            for unit in unit_weights(self.module, self.fsdp_version):
                if adapter is not None:
                    unit = checkpoint.merge_lora_weights(unit, *adapter)
                for name, tensor in unit.items():
                    yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor

    def zero_grad(self) -> None:
        """Drop pending gradients without stepping."""
        if self.optimizer is not None:
            offload.drop_gradients(self.module, self.fsdp_version)
        self._grads_pending = False

    # -- checkpoints --------------------------------------------------------------------------------------------

    @labelled("checkpoint save")
    def save_checkpoint(self, path) -> None:
        """Save sharded model and optimizer, schedule, step and RNG to ``path`` (a directory), atomically."""
        checkpoint.save(self, path)

    @labelled("checkpoint load")
    def load_checkpoint(self, path) -> None:
        checkpoint.load(self, path)

    def export_hf(self, path, merge_lora: bool = True) -> None:
        """Write full Hugging Face weights (safetensors) from rank 0; LoRA merged, or as a PEFT adapter."""
        checkpoint.export_hf(self, path, merge_lora=merge_lora)


def _as_config(config: EngineConfig | Mapping[str, Any] | None) -> EngineConfig:
    """Accept an ``EngineConfig`` or a mapping of its fields (from YAML), and name unknown keys."""
    if config is None:
        return EngineConfig()
    if isinstance(config, EngineConfig):
        return config
    if isinstance(config, Mapping):
        fields = {f.name for f in dataclasses.fields(EngineConfig)}
        for key in config:
            if key not in fields:
                raise ValueError(f"unknown engine option {key!r}{did_you_mean(key, fields)}; valid options: "
                                 f"{', '.join(sorted(fields))}")
        return EngineConfig(**config)
    raise TypeError(f"config must be an engine.EngineConfig or a mapping, got {type(config).__name__}")


def _unpack(result: Any, metrics_device: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    extra: dict = {}
    weight: Any = 1.0
    if isinstance(result, tuple):
        if len(result) == 2:
            loss, weight = result
        elif len(result) == 3:
            loss, weight, extra = result
        else:
            raise TypeError(f"step_fn returned a tuple of {len(result)}: return loss, (loss, weight) or "
                            "(loss, weight, metrics)")
    else:
        loss = result
    if not (torch.is_tensor(loss) and loss.dim() == 0):
        raise TypeError(f"step_fn must return the micro-batch's mean loss as a scalar tensor, got {loss!r:.80}")
    weight = torch.as_tensor(weight, dtype=torch.float32, device=metrics_device)
    return loss, weight, dict(extra or {})


def _accumulate(totals: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    totals[key] = totals[key] + value if key in totals else value
