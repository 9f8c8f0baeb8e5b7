"""A decoder-only transformer's FLOPs from its geometry, and the model FLOPs utilisation (MFU) they give.

MFU = the FLOPs a pass needs (counted from the model's shape, not from what kernels did) / (seconds x devices x
the backend's peak, ``DeviceBackend.peak_flops``). Counted, per token and layer: the q/k/v/o projections (grouped
KV heads: k and v are ``kv_heads x head_dim`` wide), the gated MLP (gate, up, down) and the LM head; per sequence
of length L, causal attention's scores and weighted values: 2 matmuls x 2 FLOPs x heads x head_dim x L(L+1)/2
(each position attends to itself and those before it). Embeddings, norms, activations and softmax are left out
(a few percent at most). A multiply-add is 2 FLOPs.

Passes: a forward (log-probs, a rollout's decoding: with a KV cache each token is computed once, as in one
forward over the finished sequence) is 1x; a forward and backward (the update) is 3x the forward. With LoRA the
update is counted as full fine-tuning (3x): the frozen base's weight gradients, which LoRA does not compute, are
counted and the adapters' own small matmuls are not. That is the usual convention (figures compare across
papers), and it makes a LoRA run's MFU read high by up to a third.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

FORWARD = 1.0
FORWARD_BACKWARD = 3.0


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The shape that sets a decoder's FLOPs."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config) -> Geometry | None:
        """From a transformers config (Qwen2/Llama names); ``None`` when it lacks them (no MFU then, none guessed)."""
        try:
            hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
            layers, vocab = int(config.num_hidden_layers), int(config.vocab_size)
            intermediate = int(config.intermediate_size)
        except (AttributeError, TypeError):
            return None
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        return cls(layers, hidden, intermediate, heads, int(kv_heads), int(head_dim), vocab)

    def dense_per_token(self) -> int:
        """A forward's matmul FLOPs per token outside attention's scores: projections, MLP, LM head."""
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        projections = 2 * self.hidden * (q_width + 2 * kv_width) + 2 * q_width * self.hidden
        mlp = 3 * 2 * self.hidden * self.intermediate
        return self.layers * (projections + mlp) + 2 * self.hidden * self.vocab

    def attention_per_sequence(self, length: int) -> int:
        """A forward's causal attention FLOPs (scores and weighted values) over one sequence of ``length`` tokens."""
        return self.layers * 2 * 2 * self.heads * self.head_dim * length * (length + 1) // 2

    def forward_flops(self, lengths: Iterable[int]) -> float:
        """One forward over sequences of these lengths (each attends only within itself: packed or padded alike;
        padding is not counted)."""
        lengths = [int(length) for length in lengths]
        dense = self.dense_per_token()
        return float(sum(dense * length + self.attention_per_sequence(length) for length in lengths))


def mfu(flops: float, seconds: float, devices: int, peak: float | None) -> float | None:
    """The share of ``devices`` x ``peak`` FLOP/s that ``flops`` in ``seconds`` used; ``None`` without a peak."""
    if peak is None or peak <= 0 or seconds <= 0 or devices <= 0:
        return None
    return flops / (seconds * devices * peak)


def perf_metrics(flops: dict[str, float], seconds: dict[str, float], devices: int,
                 peak: float | None) -> dict[str, float]:
    """``perf/tflops/<phase>`` (achieved TFLOP/s per device) and, with a peak, ``perf/mfu/<phase>`` for each phase
    timed and counted, plus ``perf/mfu``: the update's (the headline)."""
    row = {}
    for name, count in flops.items():
        elapsed = seconds.get(name, 0.0)
        if elapsed <= 0 or devices <= 0:
            continue
        row[f"perf/tflops/{name}"] = count / (elapsed * devices) / 1e12
        share = mfu(count, elapsed, devices, peak)
        if share is not None:
            row[f"perf/mfu/{name}"] = share
    if "perf/mfu/update" in row:
        row["perf/mfu"] = row["perf/mfu/update"]
    return row


def supervised_perf(engine, lengths: Iterable[int], seconds: float, lm_head: bool = True) -> dict[str, float]:
    """A supervised step's ``perf/*`` (SFT, DPO, RM): one forward and backward of ``engine``'s model over the
    step's sequences (every rank's) in ``seconds``. ``lm_head=False``: a sequence classifier (a reward model's score
    head is negligible). A frozen reference's forward (DPO) is in the seconds, not in the FLOPs: its MFU reads low."""
    geometry = Geometry.of(engine.model_config)
    if geometry is None:
        return {}
    if not lm_head:
        geometry = dataclasses.replace(geometry, vocab=0)
    flops = FORWARD_BACKWARD * geometry.forward_flops(lengths)
    peak = engine.backend.peak_flops(engine.compute_dtype)
    return perf_metrics({"update": flops}, {"update": seconds}, engine.world_size, peak)
