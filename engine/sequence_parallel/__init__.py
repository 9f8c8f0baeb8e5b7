"""Ulysses sequence parallelism: one micro-batch split along its tokens over a group of ranks.

``group.py``: the groups (consecutive ranks, made through the backend) and sums within one; ``exchange.py``: the
differentiable all-to-all; ``attention.py``: the ``ulysses`` attention function registered with transformers;
``split.py``: a micro-batch (``engine.packing.Layout`` or a plain batch with labels) cut into each rank's slice;
``outputs.py``: per-token log-probs of a slice and a loss share; ``checks.py``: what cannot be split, in one line.
``FSDPEngine`` builds it from ``EngineConfig.sequence_parallel_size`` (``engine.sequence_parallel``). See
``docs/sequence-parallel.md``.
"""

from .attention import ULYSSES, SplitForward, register_ulysses, ulysses_attention_forward
from .checks import config_problems, model_problems, module_problems
from .exchange import exchange
from .group import SequenceParallel
from .outputs import slice_log_probs, token_mean_share
from .split import LayoutSlice, shift_labels, split_inputs, split_layout

__all__ = ["ULYSSES", "LayoutSlice", "SequenceParallel", "SplitForward", "config_problems", "exchange",
           "model_problems", "module_problems", "register_ulysses", "shift_labels", "slice_log_probs",
           "split_inputs", "split_layout", "token_mean_share", "ulysses_attention_forward"]
