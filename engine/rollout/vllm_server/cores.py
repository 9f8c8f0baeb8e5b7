"""Whose cores the local vLLM servers and the trainer's processes compute on, and how many intra-op threads each
trainer process borrows while the servers idle: what ``rollout.vllm.borrow_threads`` (``auto`` or a number)
comes to. A pure function of the settings, the backend's ``computes_on_host_threads``, the cores this process may
run on and the trainer's processes on this host, so every case is tested with stand-ins.

``auto`` borrows only where it pays: servers this run starts on this host (not ``server_urls``), and a trainer
that computes on host threads (a backend fact, never a device name). The cores are then shared out, one share per
trainer process and per server worker: the servers take the last cores, the trainer the others; each trainer
process computes on its share of the trainer's cores and adds its share of the servers' while they idle. The
binding (``ACCEL_BORROW_BINDING``, for measuring one against the other; docs/perf.md) is how the trainer keeps off
the servers' cores while both compute: ``lend`` (the default) leaves its processes on every core with only their
own thread count, the OS placing the threads; ``split`` also binds each trainer process to its own cores then,
and to its own + borrowed cores while the servers idle. A number keeps its meaning: that many threads, no binding.
"""

from __future__ import annotations

import dataclasses
import os

from .settings import AUTO, local_servers

BINDING_ENV = "ACCEL_BORROW_BINDING"
BINDINGS = ("lend", "split")
DEFAULT_BINDING = "lend"  # measured faster than split on 2 cores (docs/perf.md, asynchronous training)


@dataclasses.dataclass(frozen=True)
class CorePlan:
    """``borrow``: the threads each trainer process adds while no request is in flight; ``why``: the reason, for
    ``--print-config``. Under ``auto`` with local servers on host threads also: each server's cores and its
    workers' threads, the trainer's cores and each trainer process's own threads, and the binding."""

    borrow: int
    why: str
    server_cores: tuple[tuple[int, ...], ...] = ()  # one per local server; empty: unbound (the OS places it)
    server_threads: int | None = None  # OMP threads of each server worker
    trainer_cores: tuple[int, ...] = ()
    trainer_threads: int | None = None  # each trainer process's own intra-op threads; None: as launched
    processes: int = 1  # the trainer's processes on this host
    binding: str | None = None

    def own_cores(self, index: int) -> set[int]:
        """Trainer process ``index``'s own cores (``split`` binds it there while the servers compute)."""
        share = len(self.trainer_cores) // self.processes
        return set(self.trainer_cores[index * share:(index + 1) * share])

    def borrowed_cores(self, index: int) -> set[int]:
        """The servers' cores trainer process ``index`` adds while they idle."""
        cores = [core for server in self.server_cores for core in server]
        return set(cores[index * self.borrow:(index + 1) * self.borrow])

    def bound_cores(self, index: int) -> tuple[set[int], set[int]] | None:
        """``split``: trainer process ``index``'s cores while the servers compute and while they idle; else None."""
        if self.binding != "split" or not self.server_cores:
            return None
        return self.own_cores(index), self.own_cores(index) | self.borrowed_cores(index)

    def shown(self) -> dict:
        """What ``--print-config`` shows (``derived.borrow_threads``)."""
        shown = {"threads": self.borrow, "why": self.why}
        if self.server_cores:
            shown.update(server_cores=[list(c) for c in self.server_cores], server_threads=self.server_threads,
                         trainer_cores=list(self.trainer_cores), trainer_threads=self.trainer_threads,
                         binding=self.binding)
        return shown


def core_plan(settings, on_host_threads: bool, backend_name: str, cores: list[int], processes: int,
              hosts: int = 1, omp_threads: int | None = None, binding: str | None = None) -> CorePlan:
    """What ``settings.borrow_threads`` comes to for ``processes`` trainer processes on this host (of ``hosts``)
    that may run on ``cores``; ``omp_threads``: the ``OMP_NUM_THREADS`` they run with, if any (a ceiling on their
    own threads); ``binding``: ``lend``/``split`` (None: ``ACCEL_BORROW_BINDING``, else the default)."""
    value = settings.borrow_threads
    if value != AUTO:
        return CorePlan(value, f"set: {value} thread(s) while the servers idle" if value else "set: never borrow")
    if settings.mode != "server":
        return CorePlan(0, "auto: 0, the engine is colocated (no server to borrow from)")
    if not local_servers(settings):
        return CorePlan(0, "auto: 0, the servers are remote (rollout.vllm.server_urls): their cores are not the "
                           "trainer's")
    if not on_host_threads:
        return CorePlan(0, f"auto: 0, the trainer computes on the device (backend {backend_name}), not on host "
                           f"threads")
    if hosts > 1:
        return CorePlan(0, f"auto: 0, the trainer spans {hosts} hosts and the servers run on one")
    cores, servers, tp = sorted(cores), local_servers(settings), settings.tensor_parallel_size
    slots = processes + servers * tp  # a share each: every trainer process and every server worker
    share = len(cores) // slots
    if not share:
        return CorePlan(0, f"auto: 0, {len(cores)} core(s) cannot give each of the {processes} trainer "
                           f"process(es) and {servers * tp} server worker(s) a core of its own")
    served = cores[len(cores) - servers * tp * share:]
    server_cores = tuple(tuple(served[i * tp * share:(i + 1) * tp * share]) for i in range(servers))
    trainer_cores = tuple(cores[:len(cores) - len(served)])
    own = len(trainer_cores) // processes
    threads = min(own, omp_threads) if omp_threads else own
    borrow = len(served) // processes
    binding = binding or os.environ.get(BINDING_ENV) or DEFAULT_BINDING
    layout = (f"the {servers} local server(s) on core(s) {_span(served)}, the {processes} trainer process(es) on "
              f"{_span(trainer_cores)} with {threads} thread(s) each")
    why = (f"auto: {borrow}, {layout}, each adding {borrow} of the servers' cores while they idle ({binding})"
           if borrow else f"auto: 0, {layout}; the servers' {len(served)} core(s) do not go round the "
                          f"{processes} trainer processes")
    return CorePlan(borrow, why, server_cores, share, trainer_cores, threads, processes, binding)


def binding_problem() -> str | None:
    value = os.environ.get(BINDING_ENV)
    if value is None or value in BINDINGS:
        return None
    return f"{BINDING_ENV}={value}: choose one of {', '.join(BINDINGS)} (or unset it: {DEFAULT_BINDING})"


def this_host_plan(settings, backend, processes: int | None = None) -> CorePlan:
    """The plan for this process: its CPU affinity, the trainer processes on its host (``processes``, else
    torchrun's ``LOCAL_WORLD_SIZE``) and the hosts they span (``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE``)."""
    world = int(os.environ.get("WORLD_SIZE", processes or 1))
    local = processes or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    omp = os.environ.get("OMP_NUM_THREADS", "")
    return core_plan(settings, bool(getattr(backend, "computes_on_host_threads", False)),
                     getattr(backend, "name", "?"), allowed_cores(), local,
                     hosts=max(1, -(-world // local)), omp_threads=int(omp) if omp.isdigit() else None)


def allowed_cores() -> list[int]:
    """The cores this process may run on (its CPU affinity; every core where the OS has none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _span(cores) -> str:
    cores = list(cores)
    return f"{cores[0]}-{cores[-1]}" if len(cores) > 2 and cores == list(range(cores[0], cores[-1] + 1)) \
        else ",".join(map(str, cores))
