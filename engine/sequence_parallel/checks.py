"""Whether a model and a configuration can be split across ``sequence_parallel_size`` ranks: one line per problem,
naming the value and what to do, before any process group or model work (and again by the engine, which knows the
world size and the model for sure)."""

from __future__ import annotations

from collections.abc import Iterator

# Attention implementations a user may leave configured with sequence parallelism: the engine's own choices, which
# it replaces by ``ulysses`` (sdpa between the exchanges).
SPLITTABLE_ATTENTION = (None, "sdpa", "packed_sdpa", "ulysses")


def divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def config_problems(size: int, world_size: int | None = None, *, fsdp_version: int = 2,
                    attn_implementation: str | None = None) -> Iterator[str]:
    """Problems of the engine settings alone (``world_size`` when it is known)."""
    if size == 1:
        return
    if world_size is not None and world_size % size:
        yield (f"engine.sequence_parallel_size={size} does not divide the world size {world_size}: use one of "
               f"{divisors(world_size)}, or start a multiple of {size} processes")
    if attn_implementation not in SPLITTABLE_ATTENTION:
        yield (f"engine.sequence_parallel_size={size} runs its own attention (the Ulysses exchange around sdpa), "
               f"not engine.attn_implementation={attn_implementation!r}: leave attn_implementation unset")
    if fsdp_version not in (1, 2):
        yield f"engine.sequence_parallel_size={size} needs fsdp_version 1 or 2, got {fsdp_version!r}"


def model_problems(size: int, model_config, facts) -> Iterator[str]:
    """Problems of splitting this model (an HF ``PretrainedConfig``) on a device with these
    ``SequenceParallelFacts``."""
    if size == 1:
        return
    if facts.unsupported:
        yield f"engine.sequence_parallel_size={size} cannot run on this device: {facts.unsupported}"
    heads = getattr(model_config, "num_attention_heads", None)
    name = type(model_config).__name__ if model_config is not None else "this model"
    if not isinstance(heads, int) or heads < 1:
        yield (f"engine.sequence_parallel_size={size}: {name} has no num_attention_heads to split across ranks: "
               "use sequence_parallel_size=1 for it")
        return
    if heads % size:
        yield (f"engine.sequence_parallel_size={size} does not divide the model's {heads} attention heads: use one "
               f"of {divisors(heads)}")
    elif (heads // size) % facts.head_multiple:
        yield (f"engine.sequence_parallel_size={size} leaves {heads // size} heads per rank, but this device's "
               f"attention wants a multiple of {facts.head_multiple}: use a smaller sequence_parallel_size")
    kinds = set(getattr(model_config, "layer_types", None) or ["full_attention"])
    if getattr(model_config, "use_sliding_window", False) and getattr(model_config, "sliding_window", None):
        kinds.add("sliding_attention")
    if kinds - {"full_attention"}:
        yield (f"engine.sequence_parallel_size={size}: {name} has {', '.join(sorted(kinds - {'full_attention'}))} "
               "layers, which the Ulysses exchange cannot split (only full causal attention): use "
               "sequence_parallel_size=1")


def module_problems(size: int, model) -> Iterator[str]:
    """Problems only the built model shows: its attention must go through transformers' attention registry."""
    if size == 1:
        return
    base = getattr(model, "get_base_model", lambda: model)()
    if not getattr(base, "_supports_attention_backend", False):
        yield (f"engine.sequence_parallel_size={size}: {type(base).__name__} does not call transformers' "
               "registered attention functions, so its attention cannot be split: use sequence_parallel_size=1")
