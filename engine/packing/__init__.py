"""Padding-free micro-batches for any trainer on the engine: plan them, lay them out, check the model takes them.

``planner.py`` decides which sequences each rank runs together (token budgets, ranks balanced by tokens, the same
number of micro-batches everywhere); ``layout.py`` turns a micro-batch into model inputs, packed in one row or
padded, and hands per-token results back per sequence; ``attention.py`` is ``packed_sdpa`` (sdpa that attends a
packed row sequence by sequence); ``probe.py`` tells whether a model's attention keeps packed sequences apart
(``FSDPEngine.packed_input_supported()`` runs it). See ``docs/engine.md``.
"""

from .attention import PACKED_SDPA, register_packed_sdpa
from .layout import FILLER_TOKEN, Layout, SequenceBatch, build_layout
from .planner import Plan, SequenceTooLong, micro_batch_load, plan_micro_batches
from .probe import ProbeResult, probe_packed_input

__all__ = ["FILLER_TOKEN", "PACKED_SDPA", "Layout", "Plan", "ProbeResult", "SequenceBatch", "SequenceTooLong",
           "build_layout", "micro_batch_load", "plan_micro_batches", "probe_packed_input", "register_packed_sdpa"]
