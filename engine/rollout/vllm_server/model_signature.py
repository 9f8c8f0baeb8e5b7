"""Whether a server runs the trainer's model: the config fields that fix its weights' names and shapes.

The trainer sends its model's signature with ``/init_weight_transfer_engine``; the server's worker compares it
with the model it serves and refuses to join when they differ, before any weight is sent (a weight the server's
model cannot take would kill its engine in the middle of a push).
"""

from __future__ import annotations

from typing import Any

SIGNATURE_FIELDS = ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings")


def signature_of(config) -> dict[str, Any]:
    """``SIGNATURE_FIELDS`` of a Hugging Face config (its text config for a multimodal one)."""
    config = getattr(config, "text_config", None) or config
    values = {name: getattr(config, name, None) for name in SIGNATURE_FIELDS}
    values["architectures"] = list(values["architectures"] or [])
    return values


def signature_differences(served: dict[str, Any], trainer: dict[str, Any]) -> list[str]:
    """``field: served X, trainer Y`` for every field the trainer names that differs."""
    return [f"{name}: served {served.get(name)!r}, trainer {trainer[name]!r}" for name in trainer
            if name in served and served.get(name) != trainer[name]]
