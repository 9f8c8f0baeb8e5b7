"""One mini-batch's forward (and backward) over its micro-batches, each counted by its weight.

``FSDPEngine.forward_backward_batch`` guards and times the call; here is the loop itself, the unpacking of what a
``step_fn`` returns, the one all-reduce of the weighted sums and the gradient scale that makes the weights hold
across ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn as nn

from ..fsdp import offload
from ..runtime import phase, start_sum_over_ranks

StepFn = Callable[[nn.Module, Any], Any]
# ``(index, count)`` of a micro-batch -> the context its forward and backward run in (``fsdp/grad_sync.py``).
MicroBatchContext = Callable[[int, int], AbstractContextManager]


def weighted_sums(module: nn.Module, micro_batches: Sequence[Any], step_fn: StepFn, metrics_device: torch.device,
                  micro_batch_context: MicroBatchContext | None) -> dict[str, torch.Tensor]:
    """Run ``step_fn`` on every micro-batch; return the sums over all ranks of ``weight`` and of the weighted loss
    and metrics.

    With ``micro_batch_context`` each micro-batch's weighted loss is backpropagated inside it; without, the
    forwards run without gradients. The sums are all-reduced once, started after the last forward so that the
    reduction runs during the last backward.
    """
    totals: dict[str, torch.Tensor] = {}
    count = len(micro_batches)
    for index, micro_batch in enumerate(micro_batches):
        last = index == count - 1
        if micro_batch_context is None:
            with torch.no_grad(), phase("forward"):
                loss, weight, extra = unpack(step_fn(module, micro_batch), metrics_device)
            pending = _add_metrics(totals, loss, weight, extra, metrics_device, start_sum=last)
            continue
        with micro_batch_context(index, count):
            with phase("forward"):
                loss, weight, extra = unpack(step_fn(module, micro_batch), metrics_device)
            # Every metric is known once the last forward is done: its all-reduce runs during the backward.
            pending = _add_metrics(totals, loss, weight, extra, metrics_device, start_sum=last)
            with phase("backward"):
                (loss * weight.to(loss.device, loss.dtype)).backward()
    with phase("metric reduction"):  # keys checked with the sums: a metric on one rank only cannot mix or hang
        return pending.result()


def weighted_means(sums: dict[str, torch.Tensor], group_size: int) -> tuple[float, dict[str, torch.Tensor]]:
    """``(total weight, each metric's weighted mean)`` from ``weighted_sums``; a total that is not positive is an
    error. Each sequence-parallel group's ranks gave their micro-batch's weight alike: it counts once per group."""
    sums = dict(sums)
    total_weight = sums.pop("weight") / group_size
    if total_weight <= 0:
        raise ValueError(f"the weights of this mini-batch sum to {total_weight} over all ranks: every "
                         "micro-batch weight must be >= 0 and at least one > 0")
    return total_weight, {key: value / total_weight for key, value in sums.items()}


def scale_gradients(module: nn.Module, factor: float) -> None:
    """FSDP averages gradients over ranks; rescale so they weight micro-batches by their share of the total."""
    grads = [offload.local(p.grad) for p in module.parameters() if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, factor)


def unpack(result: Any, metrics_device: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``(loss, weight, metrics)`` from what a ``step_fn`` returned: a loss, ``(loss, weight)`` or all three."""
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
    # A count (an int, an integer tensor) stays an integer, so token counts sum exactly at any size (float32 is
    # exact only up to 2**24); any other weight is float32.
    integral = isinstance(weight, int) or (torch.is_tensor(weight) and not weight.is_floating_point())
    weight = torch.as_tensor(weight, dtype=torch.int64 if integral else torch.float32, device=metrics_device)
    return loss, weight, dict(extra or {})


def _add_metrics(totals: dict, loss, weight, extra: Mapping, device, start_sum: bool):
    """Add one micro-batch's weighted loss and metrics to ``totals``; on the last one, start their reduction."""
    _accumulate(totals, "loss", loss.detach().float().to(device) * weight)
    _accumulate(totals, "weight", weight)
    for key, value in extra.items():
        _accumulate(totals, key, torch.as_tensor(value, dtype=torch.float32, device=device) * weight)
    return start_sum_over_ranks(totals, device) if start_sum else None


def _accumulate(totals: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    totals[key] = totals[key] + value if key in totals else value
