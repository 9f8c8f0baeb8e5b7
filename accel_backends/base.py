"""``DeviceBackend``: everything device-specific that the engine needs, in one small class.

Defaults come from ``torch.accelerator`` where it serves the device (torch runs it as its accelerator and its
allocator keeps torch's contract: CUDA, XPU), else from the torch device module of ``device_type``
(``torch.get_device_module``). So a backend for a device torch knows only sets the class attributes and says why
it cannot run where it cannot. Override what differs; nothing here is abstract.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from typing import Any, ClassVar

import torch

from . import rendezvous
from .distributed import DistributedInfo, read_launcher_env
from .errors import BackendUnavailableError, DistributedSetupError
from .facts import InferenceEngineFacts, SequenceParallelFacts, WeightGroup
from .memory import MemoryStats

DEFAULT_DIST_TIMEOUT_S = 1800.0
_ANNOUNCED: dict[str, bool] = {}  # backend name -> its distributed defaults were printed in this process


class DeviceBackend:
    """One kind of device and its collective library.

    Class attributes: ``name`` (what users select), ``device_type`` (the torch device type), ``dist_backend``
    (the ``torch.distributed`` backend), ``priority`` (auto-detection prefers higher), ``visible_devices_env``
    (the variable that restricts visible devices, if any), ``supports_pinned_memory``, ``preferred_param_dtype``
    (the dtype the engine computes in when mixed precision is "auto"; gradients are always reduced in fp32),
    ``collective_reduce_dtypes`` (the dtypes the collectives reduce: all-reduce, reduce-scatter, reduce; ``None``:
    every dtype). Nothing above the backend reduces a dtype it did not declare: the engine's own reductions use
    int64 and float32 only (``engine/runtime/metric_reduce.py``).
    """

    name: ClassVar[str] = ""
    device_type: ClassVar[str] = ""
    dist_backend: ClassVar[str] = "gloo"
    priority: ClassVar[int] = 0
    visible_devices_env: ClassVar[str | None] = None
    supports_pinned_memory: ClassVar[bool] = False
    # Whether the trainer's compute runs on host CPU threads (the CPU backend and its subclasses): then idle local
    # inference servers' cores are worth borrowing (rollout.vllm.borrow_threads=auto). A device computes on itself.
    computes_on_host_threads: ClassVar[bool] = False
    preferred_param_dtype: ClassVar[torch.dtype] = torch.float32  # what mixed precision "auto" computes in
    # False for a device whose allocator does not implement torch's accelerator contract (torch_npu): its
    # statistics then come from the device module even where torch.accelerator names the device.
    accelerator_api: ClassVar[bool] = True
    collective_reduce_dtypes: ClassVar[frozenset[torch.dtype] | None] = None  # None: every dtype reduces

    # -- availability -------------------------------------------------------------------------------------------

    def device_module(self) -> Any:
        """The torch device module (``torch.cuda``, ``torch.npu``...); raises if torch has none for this type."""
        return torch.get_device_module(self.device_type)

    def torch_accelerator(self) -> Any:
        """``torch.accelerator`` when it serves this backend's defaults, else ``None`` (the device module serves).

        It serves when this torch has its memory API (2.9+), runs this backend's device type as its accelerator,
        and the backend keeps ``accelerator_api``.
        """
        api = getattr(torch, "accelerator", None)
        if not self.accelerator_api or api is None or not hasattr(api, "memory_allocated"):
            return None
        try:
            current = api.current_accelerator()
        except Exception:  # noqa: BLE001 - a broken probe means the device module serves
            return None
        return api if current is not None and current.type == self.device_type else None

    def unavailable_reason(self) -> str | None:
        """``None`` when usable, else one sentence saying why not and what to do. Never raises."""
        try:
            module = self.device_module()
        except Exception as exc:  # noqa: BLE001 - every failure is a reason, not a crash
            return f"torch has no '{self.device_type}' device module ({exc})"
        return self.no_visible_device(module, f"no {self.device_type} device is visible")

    def no_visible_device(self, module: Any, problem: str, advice: str = "", label: str | None = None) -> str | None:
        """``problem`` (with the visible-devices variable and ``advice``) when ``module`` sees no device, a sentence
        naming the failure when probing it raises, else ``None``. Never raises."""
        try:
            if not module.is_available() or module.device_count() == 0:
                return f"{problem}{self._visible_devices_hint()}{advice}"
        except Exception as exc:  # noqa: BLE001 - a broken driver is a reason, not a crash
            return f"probing {label or self.device_type} failed: {type(exc).__name__}: {exc}"
        return None

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def require_available(self) -> None:
        """Raise ``BackendUnavailableError`` with the backend's reason when it cannot run here."""
        reason = self.unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(f"backend '{self.name}' is not available here: {reason}")

    def _visible_devices_hint(self) -> str:
        if self.visible_devices_env and self.visible_devices_env in os.environ:
            return f" ({self.visible_devices_env}={os.environ[self.visible_devices_env]!r})"
        return ""

    def describe(self) -> dict:
        """Versions and settings worth printing in diagnostics (with the devices' names); backends add their own."""
        info: dict = {"torch": torch.__version__}
        if self.is_available():
            names = _call_or_none(self.device_module(), "get_device_name", 0)
            if names is not None:
                info["devices"] = [self.device_module().get_device_name(i) for i in range(self.device_count())]
        return info

    def peak_flops(self, dtype: torch.dtype) -> float | None:
        """One device's peak dense FLOP/s computing in ``dtype``, the denominator of MFU
        (``engine/runtime/flops.py``); ``None`` where it is not known (no MFU is then reported, never a guessed one).
        Backends declare or measure it."""
        return None

    def explain_autoload_failure(self, failure: dict) -> str | None:
        """What to do when ``import torch`` fails in torch's device-backend autoload (``failure``: the entry point,
        its distribution and what it raised; ``accel_backends.torch_import``), if that entry point is this
        backend's vendor package; else ``None``."""
        return None

    # -- devices ------------------------------------------------------------------------------------------------

    def _api(self) -> Any:
        """What serves the defaults below: ``torch.accelerator`` where it can, else the device module."""
        return self.torch_accelerator() or self.device_module()

    def device_count(self) -> int:
        return self._api().device_count() if self.is_available() else 0

    def current_index(self) -> int:
        api = self.torch_accelerator()
        return api.current_device_index() if api else self.device_module().current_device()

    def device(self, index: int | None = None) -> torch.device:
        """The torch device for ``index``, or the current device of this process."""
        return torch.device(self.device_type, self.current_index() if index is None else index)

    def set_device(self, index: int) -> None:
        api = self.torch_accelerator()
        if api:
            api.set_device_index(index)
        else:
            self.device_module().set_device(index)

    def synchronize(self) -> None:
        self._api().synchronize()

    # -- memory -------------------------------------------------------------------------------------------------

    def memory_stats(self) -> MemoryStats:
        api, module = self.torch_accelerator(), self.device_module()
        source = api or module
        # torch.accelerator has free/total from torch 2.10 (get_memory_info); device modules call it mem_get_info.
        free_total = (_call_or_none(api, "get_memory_info") if api else None) or _call_or_none(module, "mem_get_info")
        free, total = free_total if free_total is not None else (None, None)
        return MemoryStats(
            allocated=_call_or_none(source, "memory_allocated"),
            reserved=_call_or_none(source, "memory_reserved"),
            peak_allocated=_call_or_none(source, "max_memory_allocated"),
            total=total,
            free=free,
        )

    def reset_peak_memory_stats(self) -> None:
        _call_or_none(self._api(), "reset_peak_memory_stats")

    def empty_cache(self) -> None:
        _call_or_none(self._api(), "empty_cache")

    # -- moves --------------------------------------------------------------------------------------------------

    def to_device(self, tensor: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        """Copy to this process's device (a no-op if already there)."""
        return tensor.to(self.device(), non_blocking=non_blocking)

    def to_host(self, tensor: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        """Copy to host memory, pinned where the device supports it so the way back can overlap compute.

        With ``non_blocking=True`` call ``synchronize()`` before reading the result.
        """
        if tensor.device.type == "cpu":
            return tensor
        if not self.supports_pinned_memory:
            return tensor.to("cpu")
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
        host.copy_(tensor, non_blocking=non_blocking)
        return host

    # -- models -------------------------------------------------------------------------------------------------

    def attention_implementation(self, packed: bool = True) -> str:
        """The transformers ``attn_implementation`` models should use here, for packed input or for padded input.

        Packed input is several sequences end to end in one row, ``position_ids`` restarting at 0 for each, no
        attention mask; the engine loads models with this choice unless told otherwise and checks, with a tiny
        forward, that the model really keeps packed sequences apart. The default, ``"sdpa"`` (torch's
        scaled-dot-product attention), runs on every device torch supports and takes packed input in transformers.
        """
        return "sdpa"

    def inference_engine_facts(self) -> InferenceEngineFacts:
        """How a colocated inference engine (``rollout.engine=vllm``) runs on this device. The default is the
        conservative one: no sleep mode, the worker's ``reload_weights``, memory by device share."""
        return InferenceEngineFacts()

    def sequence_parallel_facts(self) -> SequenceParallelFacts:
        """What sequence parallelism must know about this device; the default: it runs, with any head count."""
        return SequenceParallelFacts()

    # -- distributed --------------------------------------------------------------------------------------------

    def distributed_env_defaults(self, timeout_s: float) -> dict[str, str]:
        """Environment variables the collective library should have unless the user set them (e.g. its own
        timeouts), applied by ``init_distributed`` before the process group starts. ``timeout_s``: the group's."""
        return {}

    def apply_distributed_env_defaults(self, timeout_s: float, announce: bool = True) -> dict[str, str]:
        """Set each of ``distributed_env_defaults`` that the environment lacks; return those set. With
        ``announce``, rank 0 says so once per process (on stderr)."""
        applied = {key: str(value) for key, value in self.distributed_env_defaults(timeout_s).items()
                   if key not in os.environ}
        os.environ.update(applied)
        if applied and announce and os.environ.get("RANK", "0") == "0" and not _ANNOUNCED.get(self.name):
            _ANNOUNCED[self.name] = True
            settings = ", ".join(f"{key}={value}" for key, value in applied.items())
            print(f"accel-backends: {self.name}: {settings} (defaults for its collectives; set them to override)",
                  file=sys.stderr, flush=True)
        return applied

    def init_distributed(self, timeout: float | datetime.timedelta = DEFAULT_DIST_TIMEOUT_S) -> DistributedInfo:
        """Join the job torchrun started, binding this process to its local device; idempotent.

        Without torchrun's variables this makes a group of one (rank 0, world size 1) on an in-memory store, so
        the same code runs under ``python`` and under ``torchrun``.
        """
        import torch.distributed as dist

        info = read_launcher_env()
        if dist.is_initialized():
            current = dist.get_backend()
            if current != self.dist_backend:
                raise DistributedSetupError(
                    f"a '{current}' process group is already initialised, but backend '{self.name}' needs "
                    f"'{self.dist_backend}'. Select the backend that created it, or destroy that group first."
                )
            return dataclasses.replace(info, rank=dist.get_rank(), world_size=dist.get_world_size())
        self.require_available()
        self._bind_local_device(info)
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=timeout)
        self.apply_distributed_env_defaults(timeout.total_seconds())
        kwargs: dict[str, Any] = {"backend": self.dist_backend, "timeout": timeout}
        if info.launched:
            # not env://: its store would listen on every interface (rendezvous.py)
            kwargs.update(init_method=rendezvous.init_method(), rank=info.rank, world_size=info.world_size)
        else:
            kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
        device_id = self.process_group_device_id()
        if device_id is not None:
            kwargs["device_id"] = device_id
        dist.init_process_group(**kwargs)
        return info

    def _bind_local_device(self, info: DistributedInfo) -> None:
        count = self.device_count()
        if info.local_rank >= count:
            raise DistributedSetupError(
                f"LOCAL_RANK={info.local_rank} but only {count} {self.device_type} device(s) are visible"
                f"{self._visible_devices_hint()}: start fewer processes per node or make more devices visible."
            )
        self.set_device(info.local_rank)

    def new_group(self, ranks: list[int]) -> Any:
        """A process group of ``ranks`` on ``dist_backend`` (a collective: every rank of the job calls it, for every
        group, in the same order)."""
        import torch.distributed as dist

        return dist.new_group(ranks=list(ranks), backend=self.dist_backend)

    def new_weight_group(self, store: Any, rank: int, world_size: int, timeout_s: float) -> WeightGroup:
        """The process group that pushes a trainer's weights into vLLM servers: the trainer's sender at rank 0,
        the servers' workers after it, meeting at ``store`` (the TCP store the trainer's sender hosts; each member
        is in the trainer's job or in a server, never in both, so this is not a group of the default one). Built
        by the trainer and, inside every server, by this package's receiving engine through the same backend.

        The default is gloo over host memory (every device can stage its weights through the host); a device with
        a collective library of its own returns that library's group on its device (cuda: NCCL, npu: HCCL). The
        wire calls only ``broadcast`` from rank 0, on the caller's current stream, and waits on each work."""
        from torch.distributed import ProcessGroupGloo

        group = ProcessGroupGloo(store, rank, world_size, datetime.timedelta(seconds=timeout_s))
        return WeightGroup(group, torch.device("cpu"))

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, group: Any = None) -> None:
        """Chunk ``i`` of ``input`` (along dim 0, one per rank of ``group``) goes to rank ``i``; ``output`` receives
        rank ``i``'s chunk at ``i``. Both contiguous, same shape. A backend whose library lacks ``all_to_all_single``
        overrides it."""
        import torch.distributed as dist

        dist.all_to_all_single(output, input, group=group)

    def process_group_device_id(self) -> torch.device | None:
        """The device ``init_process_group(device_id=...)`` binds eagerly; ``None`` where that is not wanted."""
        return self.device()

    def fsdp_device_id(self) -> torch.device:
        """What FSDP1's ``device_id`` must be on this backend."""
        return self.device()

    def metrics_device(self) -> torch.device:
        """Where small tensors must live for an all-reduce through ``dist_backend``."""
        return self.device()

    # -- randomness ---------------------------------------------------------------------------------------------

    def manual_seed(self, seed: int) -> None:
        """Seed the host generator and every device generator of this kind."""
        torch.manual_seed(seed)
        _call_or_none(self.device_module(), "manual_seed_all", seed)

    def rng_state(self) -> dict[str, torch.Tensor]:
        state = {"cpu": torch.get_rng_state()}
        device_state = _call_or_none(self.device_module(), "get_rng_state")
        if device_state is not None:
            state["device"] = device_state
        return state

    def set_rng_state(self, state: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["cpu"])
        if "device" in state:
            self.device_module().set_rng_state(state["device"])

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} device_type={self.device_type!r}>"


def _call_or_none(module: Any, function: str, *args: Any) -> Any:
    """Call ``module.function(*args)`` if the device module has it, else ``None`` (not every device has all)."""
    fn = getattr(module, function, None)
    return fn(*args) if callable(fn) else None

