"""The process runtime under the engine: the launcher, stop requests, phase labels, metric reduction, the
exchange of every rank's rows and the intra-op threads borrowed from idle servers.

It knows processes and collectives, never FSDP (``engine/fsdp/``), so a trainer can use it on its own.
"""

from .borrowed_threads import BorrowedThreads, borrowing_problem
from .exchange import all_gather_rows, on_any_rank, on_every_rank
from .flops import FORWARD_BACKWARD, Geometry, perf_metrics, supervised_perf
from .launcher import (
    Interrupted,
    WorkerFailed,
    report_early_end,
    run,
    threads_per_worker,
    under_launcher,
    usable_cores,
)
from .metric_reduce import MetricKeysMismatch, max_over_ranks, start_sum_over_ranks, sum_over_ranks
from .phase_labels import PhaseTimes, labelled, phase, phase_of, phase_timings
from .stop import install_stop_handlers, stop_at_safe_point, stop_requested
from .teardown import OneLineError, at_group_end

__all__ = ["FORWARD_BACKWARD", "Geometry", "perf_metrics", "supervised_perf",
           "BorrowedThreads", "Interrupted", "MetricKeysMismatch", "OneLineError", "PhaseTimes", "WorkerFailed",
           "all_gather_rows", "at_group_end", "borrowing_problem", "install_stop_handlers", "labelled",
           "max_over_ranks", "on_any_rank", "on_every_rank", "phase", "phase_of", "phase_timings",
           "report_early_end", "run", "start_sum_over_ranks", "stop_at_safe_point", "stop_requested",
           "sum_over_ranks", "threads_per_worker", "under_launcher", "usable_cores"]
