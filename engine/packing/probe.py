"""Can this model take packed input? A tiny forward that tells, rather than trusting the attention's name.

Packing relies on the attention implementation keeping each sequence of a packed row to itself. ``sdpa``,
``eager`` and flash-attention in transformers do; a custom or older implementation may attend across the whole
row instead, which gives wrong log-probs without any error. So the probe scores two short sequences three ways:

* padded (one row each, right-padded with a mask): the reference;
* packed (one row, positions restarting, no mask): what packing computes;
* leaked (the packed row with a plain all-ones mask): what an attention that ignores the packing computes.

Packing works when its result is much closer to the reference than to the leaked one (4x, so that bf16 rounding,
about 5e-3 here, cannot pass for the difference leaking makes, about 0.5 on a random model). Every rank runs the
same forwards (a sharded model's forward is a collective) and reaches the same verdict.
"""

from __future__ import annotations

import dataclasses

import torch

from .layout import SequenceBatch, build_layout

PROMPT_TOKENS, SCORED_TOKENS = (3, 2), (3, 8)  # two sequences of 6 and 10 tokens
MARGIN = 4.0


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    works: bool
    packed_error: float  # max |log-prob packed - padded| over the scored tokens
    leak_error: float  # max |log-prob packed - leaked|
    error: str | None = None  # the exception the packed forward raised, if any

    def describe(self) -> str:
        if self.error:
            return f"the packed forward raised {self.error}"
        return (f"packed log-probs differ from padded ones by up to {self.packed_error:.2g} and from a row whose "
                f"attention leaks across sequences by {self.leak_error:.2g}")


def _scored_log_probs(module, inputs: dict, plan) -> torch.Tensor:
    output = module(**inputs, logits_to_keep=plan.logits_to_keep, use_cache=False)
    logits = plan.select(output.logits).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, plan.targets.unsqueeze(-1)).squeeze(-1)


def probe_packed_input(module, device: torch.device, vocab_size: int) -> ProbeResult:
    """Score the probe's sequences padded, packed and leaked under ``module`` (no gradients) and compare."""
    total = sum(PROMPT_TOKENS) + sum(SCORED_TOKENS)
    ids = (torch.arange(total) * 7 + 3) % vocab_size
    pieces, cursor = [], 0
    for size in (*PROMPT_TOKENS, *SCORED_TOKENS):
        pieces.append(ids[cursor:cursor + size])
        cursor += size
    batch = SequenceBatch.from_parts(pieces[:2], pieces[2:])
    padded = build_layout(batch, [0, 1], packed=False).to(device)
    packed = build_layout(batch, [0, 1], packed=True).to(device)
    leaked_inputs = {**packed.inputs, "attention_mask": torch.ones_like(packed.inputs["input_ids"])}
    with torch.no_grad():
        reference = _scored_log_probs(module, padded.inputs, padded)
        try:
            got = _scored_log_probs(module, packed.inputs, packed)
        except Exception as exc:  # noqa: BLE001 - an attention that refuses packed input is a "no", not a crash
            return ProbeResult(False, float("inf"), 0.0, f"{type(exc).__name__}: {exc}")
        leaked = _scored_log_probs(module, leaked_inputs, packed)
    packed_error = (got - reference).abs().max().item()
    leak_error = (got - leaked).abs().max().item()
    works = packed_error <= 1e-6 or MARGIN * packed_error <= leak_error
    return ProbeResult(works, packed_error, leak_error)
