"""``FSDPEngine``: shard a model, run micro-batched forward/backward, step, offload and checkpoint it.

The engine knows FSDP, models and optimizers; everything about the device comes from the backend it is given
(``accel_backends.get_backend()`` by default), so both fixes below apply the same way on every device:

* offload-aware fast path: with nothing offloaded and the module already in the wanted mode, entering and leaving
  ``train_mode``/``eval_mode`` moves nothing, calls neither ``gc.collect()`` nor ``empty_cache()`` and walks no
  submodule, whatever the depth of the model;
* deferred gradient sync: gradients are reduced once per mini-batch, on its last micro-batch (``fsdp/grad_sync.py``),
  when the unsharded gradients this needs fit the device (``fsdp/sync_plan.py``).

Its parts, one concern each, are in ``engine/facade/``: the choices made while it is built, the mini-batch loop and
its weighting, where parameters and optimizer state live, the module's train/eval mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import accel_backends

from . import checkpoint, events, packing
from .config import EngineConfig, as_config
from .facade import mini_batch, setup
from .facade.mini_batch import StepFn
from .facade.module_mode import ModuleMode
from .facade.residency import Residency
from .fsdp import adapter_weights, offload, private_state, rank0_loading, sync_plan
from .fsdp.full_weights import unit_weights
from .fsdp.grad_sync import discard_partial_backward, micro_batch_context
from .fsdp.model_prep import lora_adapter, lora_config, prepare_model
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
from .runtime import labelled, on_every_rank, phase

__all__ = ["FSDPEngine", "StepFn"]


class FSDPEngine:
    """One sharded model with its optimizer and schedule, on one backend. See ``docs/engine.md``."""

    def __init__(self, model: nn.Module | Callable[[], nn.Module] | str | os.PathLike,
                 config: EngineConfig | None = None, backend: accel_backends.DeviceBackend | None = None) -> None:
        config = as_config(config)
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
        self.sequence_parallel = setup.sequence_parallel_group(self.config, self.world_size, self.model_config, built,
                                                               self.backend)
        self.attn_implementation = setup.attention_choice(self.config, self.backend, self.sequence_parallel.enabled)
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
        self.grad_sync_plan = setup.plan_grad_sync(self.config, self.backend, self.fsdp_version, self.world_size,
                                                   self.rank, trainable)
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
        self._residency = Residency(self.config, self.backend)
        self._grads_pending = False
        self._module_mode = ModuleMode(self.module)
        self._update_peak_open = False  # the peak-memory figure already covers this update's onload
        self.packed_input_probe: packing.ProbeResult | None = None  # set by packed_input_supported()
        if self.config.param_offload:
            self.to(HOST, model=True, optimizer=False)
        if self.config.optimizer_offload:
            self.to(HOST, model=False, optimizer=True)

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
        return self._residency.as_dict()

    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> None:
        """Move parameters (with buffers) and/or optimizer state to ``"device"`` or ``"cpu"``.

        Parts already there are not touched. Gradients live with their parameters (torch requires it): ``grad``
        lets existing gradients travel along; ``grad=False`` while gradients exist is an error.
        """
        self._residency.move(self, device, model=model, optimizer=optimizer, grad=grad)

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
            onload = [] if disable_auto_offload else self._residency.offloaded(wanted)
            # The fast path: with nothing offloaded ``onload`` is empty and no move, gc or cache call happens.
            if onload:
                if mode == "train" and not self._grads_pending:
                    self._start_update_peak()  # the update's peak includes bringing its parts in
                self.to(DEVICE, model="params" in onload, optimizer="optimizer" in onload)
            self._module_mode.enter(mode == "train")  # no submodule walked when the mode is already set
            try:
                yield
            finally:
                self._module_mode.leave()
                if onload:
                    self.to(HOST, model="params" in onload, optimizer="optimizer" in onload)
                    # Moved tensors are freed by reference counting; no gc.collect() is needed (docs/engine.md).
                    self.backend.empty_cache()
        finally:
            events.mode_switch(self, mode, entering=False)

    def _start_update_peak(self) -> None:
        """Restart the backend's peak-memory figure for the update that begins now (onload included).

        An update runs from here (or from its ``forward_backward_batch``) to the end of its ``optimizer_step``,
        which reports the peak of all of it.
        """
        self.backend.reset_peak_memory_stats()
        self._update_peak_open = True

    def _peak_gib(self) -> float:
        return (self.backend.memory_stats().peak_allocated or 0) / 2**30

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
        self._residency.require_on_device("forward_backward_batch", ["params"])
        if not forward_only and self.config.frozen:
            raise RuntimeError("this engine is frozen (a reference model): use forward_only=True")
        if not forward_only and self._grads_pending:
            raise RuntimeError("gradients of an earlier forward_backward_batch are still pending: call "
                               "optimizer_step() before the next mini-batch")
        start = time.perf_counter()
        if not self._update_peak_open:  # else an update is under way: its figure began at train_mode entry
            self.backend.reset_peak_memory_stats()
            self._update_peak_open = not forward_only
        if not forward_only:
            self._grads_pending = True
        try:
            sums = mini_batch.weighted_sums(self.module, micro_batches, step_fn, self.backend.metrics_device(),
                                            None if forward_only else self._micro_batch_context())
        except BaseException:
            if not forward_only:  # partial gradients of a failed mini-batch are useless: start clean
                try:
                    discard_partial_backward(self.module, self.fsdp_version)
                    self.zero_grad()
                except Exception as cleanup_error:  # noqa: BLE001 - never hide the user's error behind ours
                    warnings.warn(f"could not reset the engine after a failed micro-batch: {cleanup_error!r}",
                                  stacklevel=2)
            raise
        total_weight, metrics = mini_batch.weighted_means(sums, self.sequence_parallel.size)
        if not forward_only:
            mini_batch.scale_gradients(self.module, self.world_size / total_weight)
        metrics.update(weight=total_weight, micro_batches=float(len(micro_batches)),
                       time_s=time.perf_counter() - start, peak_memory_gib=self._peak_gib())
        self.last_metrics = metrics
        return metrics

    def _micro_batch_context(self) -> mini_batch.MicroBatchContext:
        """``(index, count)`` -> the context of that micro-batch's forward and backward (``fsdp/grad_sync.py``)."""
        return functools.partial(micro_batch_context, self.module, self.fsdp_version,
                                 deferred=self.grad_sync_mode == "deferred",
                                 keep_unsharded=self.config.keep_params_unsharded, units=self._fsdp2_units)

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
        self._residency.require_on_device("optimizer_step", ["params"] if onload else ["params", "optimizer"])
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
        self._residency.require_on_device("generation", ["params"])
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

    def iter_full_weights(self, merge_lora: bool = True, base_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` for every parameter, gathered one sharded unit at a time (a collective: every
        rank must consume it): what a rollout engine with its own copy of the model loads after an update. Memory
        stays at one unit: each tensor is valid until the next is drawn (copy it to keep it); in the compute dtype.
        With LoRA and ``merge_lora`` (the default) each base weight comes with its adapter folded in (``W + scaling *
        B @ A``) under the plain model's names; ``merge_lora=False`` gives PEFT's own names, adapters included;
        ``base_only`` the base weights alone, plain names. Offloaded parameters come in for the call and go back."""
        dtype = compute_dtype(self.config, self.backend)
        adapter = lora_adapter(self.module) if merge_lora and not base_only else None
        with self.eval_mode():
            for unit in unit_weights(self.module, self.fsdp_version):
                unit = adapter_weights.base_weights(unit) if base_only else unit
                if adapter is not None:
                    unit = checkpoint.merge_lora_weights(unit, *adapter)
                for name, tensor in unit.items():
                    yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor

    @property
    def lora_config(self):  # the PEFT LoraConfig of the policy's LoRA adapter (r, lora_alpha, targets), or None
        return (lora_config(self.module) or (None, None))[1]

    def iter_adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name as in a PEFT adapter file, full tensor)`` for the LoRA adapter alone, in the compute dtype, each the
        rank's own copy (a collective). Its shards are gathered, never the base weights: two all-gathers."""
        adapter = (lora_config(self.module) or ("default",))[0]  # its name, which an adapter file leaves out
        with self.eval_mode():
            yield from adapter_weights.gather_adapter(self.module, self.fsdp_version, self.compute_dtype, adapter)

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
