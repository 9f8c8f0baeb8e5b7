"""``FSDPEngine``: shard a model, run micro-batched forward/backward, step, offload and checkpoint it.

The engine knows FSDP, models and optimizers; everything about the device comes from the backend it is given
(``accel_backends.get_backend()`` by default), so both fixes below apply the same way on every device:

* offload-aware fast path: with nothing offloaded, entering ``train_mode``/``eval_mode`` moves nothing and calls
  neither ``gc.collect()`` nor ``empty_cache()``;
* deferred gradient sync: gradients are reduced once per mini-batch, on its last micro-batch (``grad_sync.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import accel_backends

from . import checkpoint, events, offload
from .config import EngineConfig
from .grad_sync import discard_partial_backward, micro_batch_context
from .models import prepare_model
from .offload import DEVICE, HOST
from .optim import build_optimizer, build_scheduler, clip_gradients
from .phase import labelled, phase
from .reduce import sum_over_ranks
from .sharding import generation_context, shard_model, unwrap

StepFn = Callable[[nn.Module, Any], Any]


class FSDPEngine:
    """One sharded model with its optimizer and schedule, on one backend. See ``docs/engine.md``."""

    def __init__(self, model: nn.Module | Callable[[], nn.Module], config: EngineConfig | None = None,
                 backend: accel_backends.DeviceBackend | None = None) -> None:
        config = _as_config(config)
        if not isinstance(model, nn.Module) and not callable(model):
            raise TypeError(f"model must be an nn.Module or a zero-argument factory, got {type(model).__name__}")
        self.config = config
        self.backend = backend or accel_backends.get_backend()
        self.backend.require_available()
        self.dist_info = self.backend.init_distributed(timeout=self.config.dist_timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.backend.manual_seed(self.config.seed)

        built = model if isinstance(model, nn.Module) else model()
        if not isinstance(built, nn.Module):
            raise TypeError(f"the model factory returned {type(built).__name__}, not an nn.Module")
        self.model_config = getattr(built, "config", None)
        prepared = prepare_model(built, self.config)
        if self.config.frozen:
            prepared.requires_grad_(False)  # before sharding, so FSDP knows no gradients are wanted
        self.module, self.num_sharded_units = shard_model(prepared, self.config, self.backend, self.world_size)
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
        if self.config.param_offload:
            self.to(HOST, model=True, optimizer=False)
        if self.config.optimizer_offload:
            self.to(HOST, model=False, optimizer=True)

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
        version = self.config.fsdp_version
        if model and self._residency["params"] != device:
            param_bytes, grad_bytes = offload.model_bytes(self.module, version)
            if grad_bytes and not grad:
                raise ValueError("gradients exist and must move with their parameters: pass grad=True, or call "
                                 "optimizer_step() first")
            offload.move_model(self.module, version, self.backend, device)
            self._residency["params"] = device
            events.transfer(self, "params", device, param_bytes)
            if grad_bytes:
                events.transfer(self, "grads", device, grad_bytes)
        if optimizer and self.optimizer is not None and self._residency["optimizer"] != device:
            num_bytes = offload.optimizer_bytes(self.optimizer)
            offload.move_optimizer(self.optimizer, self.backend, device)
            self._residency["optimizer"] = device
            events.transfer(self, "optimizer", device, num_bytes)

    @contextlib.contextmanager
    def train_mode(self, disable_auto_offload: bool = False):
        """Train with everything on the device; what is offloaded comes in on entry and goes back on exit."""
        with self._mode("train", disable_auto_offload, wanted=("params", "optimizer")):
            yield self

    @contextlib.contextmanager
    def eval_mode(self, disable_auto_offload: bool = False):
        """Forward only (rollouts, log-probs): parameters on the device, optimizer state left where it is."""
        with self._mode("eval", disable_auto_offload, wanted=("params",)):
            yield self

    @contextlib.contextmanager
    def _mode(self, mode: str, disable_auto_offload: bool, wanted: tuple[str, ...]):
        events.mode_switch(self, mode, entering=True)
        onload = []
        if not disable_auto_offload:
            offloaded = {"params": self.config.param_offload, "optimizer": self.config.optimizer_offload}
            onload = [p for p in wanted if offloaded[p] and self._residency[p] == HOST]
        # The fast path: with nothing offloaded ``onload`` is empty and no move, gc or cache call happens.
        if onload:
            self.to(DEVICE, model="params" in onload, optimizer="optimizer" in onload)
        was_training = self.module.training
        self.module.train(mode == "train")
        try:
            yield
        finally:
            self.module.train(was_training)
            if onload:
                self.to(HOST, model="params" in onload, optimizer="optimizer" in onload)
                # Moved tensors are freed by reference counting; no gc.collect() is needed (docs/engine.md).
                self.backend.empty_cache()
            events.mode_switch(self, mode, entering=False)

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
        self.backend.reset_peak_memory_stats()
        metrics_device = self.backend.metrics_device()
        totals: dict[str, torch.Tensor] = {}
        count = len(micro_batches)
        deferred = self.config.grad_sync == "deferred"
        if not forward_only:
            self._grads_pending = True
        try:
            for index, micro_batch in enumerate(micro_batches):
                if forward_only:
                    with torch.no_grad(), phase("forward"):
                        loss, weight, extra = _unpack(step_fn(self.module, micro_batch), metrics_device)
                else:
                    with micro_batch_context(self.module, self.config.fsdp_version, index, count,
                                             deferred=deferred, keep_unsharded=self.config.keep_params_unsharded):
                        with phase("forward"):
                            loss, weight, extra = _unpack(step_fn(self.module, micro_batch), metrics_device)
                        with phase("backward"):
                            (loss * weight.to(loss.device, loss.dtype)).backward()
                _accumulate(totals, "loss", loss.detach().float().to(metrics_device) * weight)
                _accumulate(totals, "weight", weight)
                for key, value in extra.items():
                    value = torch.as_tensor(value, dtype=torch.float32, device=metrics_device)
                    _accumulate(totals, key, value * weight)
            with phase("metric reduction"):  # keys agreed first: a metric on one rank only cannot mix or hang
                reduced = sum_over_ranks(totals, metrics_device)
        except BaseException:
            if not forward_only:  # partial gradients of a failed mini-batch are useless: start clean
                try:
                    discard_partial_backward(self.module, self.config.fsdp_version)
                    self.zero_grad()
                except Exception as cleanup_error:  # noqa: BLE001 - never hide the user's error behind ours
                    warnings.warn(f"could not reset the engine after a failed micro-batch: {cleanup_error!r}",
                                  stacklevel=2)
            raise
        total_weight = reduced.pop("weight")
        if total_weight <= 0:
            raise ValueError(f"the weights of this mini-batch sum to {total_weight} over all ranks: every "
                             "micro-batch weight must be >= 0 and at least one > 0")
        if not forward_only:
            self._scale_gradients(self.world_size / total_weight)
        metrics = {key: value / total_weight for key, value in reduced.items()}
        peak = self.backend.memory_stats().peak_allocated
        metrics.update(weight=total_weight, micro_batches=float(count), time_s=time.perf_counter() - start,
                       peak_memory_gib=(peak or 0) / 2**30)
        self.last_metrics = metrics
        return metrics

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
        and is reported as ``skipped`` in ``last_step_metrics`` and to ``on_optimizer_step`` observers.
        """
        if self.optimizer is None:
            raise RuntimeError("this engine is frozen (a reference model) and has no optimizer")
        self._require_on_device("optimizer_step", ["params", "optimizer"])
        lr = self.scheduler.get_last_lr()[0]
        norm = float(clip_gradients(self.module, self.config.fsdp_version, self.config.max_grad_norm))
        skipped = not math.isfinite(norm)
        if skipped:
            self.skipped_steps += 1
        else:
            self.optimizer.step()
            self.scheduler.step()
        self.zero_grad()
        self.global_step += 1
        self.last_step_metrics = {"step": self.global_step, "grad_norm": norm, "lr": lr, "skipped": skipped}
        events.optimizer_step(self, self.global_step, self.last_step_metrics)
        return norm

    # -- generation ---------------------------------------------------------------------------------------------

    def generate(self, **kwargs: Any) -> torch.Tensor:
        """Hugging Face ``generate`` on the sharded model (FSDP1 or FSDP2), without gradients."""
        self._require_on_device("generate", ["params"])
        with torch.no_grad(), generation_context(self.module, self.config.fsdp_version):
            return unwrap(self.module, self.config.fsdp_version).generate(**kwargs)

    def zero_grad(self) -> None:
        """Drop pending gradients without stepping."""
        if self.optimizer is not None:
            offload.drop_gradients(self.module, self.config.fsdp_version)
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
                close = difflib.get_close_matches(key, fields, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown engine option {key!r}{hint}; valid options: {', '.join(sorted(fields))}")
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
