"""Tiny random Qwen2 models built from a config, nothing downloaded: the one builder that tests, benchmarks, the
conformance rules, the CPU demo's model and ``accel-grpo make-tiny-model`` share."""

from __future__ import annotations

# Dims that neither 2 nor 3 ranks divide (97, 35, 71; and 32, 16 on 3): FSDP2 pads the last rank's shards. The model
# of the conformance kit's engine rules and of the report card (``accel-backends certify``).
UNEVEN = {"vocab_size": 97, "hidden_size": 35, "heads": 4, "kv_heads": 2, "head_dim": 8, "intermediate_size": 71}


def tiny_qwen2_config(*, vocab_size: int, hidden_size: int = 64, layers: int = 2, intermediate_size: int | None = None,
                      heads: int = 4, kv_heads: int = 2, max_positions: int = 128, **extra):
    """A ``Qwen2Config`` of the given size (intermediate ``2 x hidden`` by default, untied embeddings).

    ``extra`` goes to the config as it is (token ids, ``attn_implementation``...).
    """
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size,
                       intermediate_size=intermediate_size or 2 * hidden_size, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                       tie_word_embeddings=False, **extra)


def tiny_qwen2(*, seed: int | None = None, **config):
    """A ``Qwen2ForCausalLM`` with random weights; the same weights on every call (and rank) for one ``seed``."""
    import torch
    from transformers import Qwen2ForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_qwen2_config(**config))
