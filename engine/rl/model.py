"""The policy's tokenizer and model source: the built-in character model's factory, or a local HF directory."""

from __future__ import annotations

from ..tiny_model import tiny_qwen2
from ..train.model_dir import check_model_dir  # noqa: F401  (GRPO's config and eval use it from here)

BUILTIN_MODEL = "builtin:tiny-char"  # model.path of the CPU demo's character model, built in code


def build_model(model_config):
    """(tokenizer, model source) for ``ModelConfig``: a factory, or the directory the engine loads on rank 0."""
    if model_config.path == BUILTIN_MODEL:
        from .prompts import EchoTask
        from .tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer(EchoTask.alphabet)

        def factory():
            return tiny_qwen2(vocab_size=len(tokenizer), hidden_size=model_config.hidden_size,
                              layers=model_config.layers, pad_token_id=tokenizer.pad_token_id,
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)

        return tokenizer, factory

    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # one "Loading weights" bar per rank and model is noise in the job's output
    tokenizer = AutoTokenizer.from_pretrained(model_config.path, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # The directory itself, not a factory: the engine then reads it on rank 0 only (engine/fsdp/rank0_loading.py).
    return tokenizer, model_config.path
