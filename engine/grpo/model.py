"""The policy's tokenizer and model source: the built-in character model's factory, or a local HF directory."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import BUILTIN_MODEL


def check_model_dir(path: str) -> list[str]:
    """Problems with a model directory that would otherwise surface as tracebacks inside every worker."""
    directory = Path(path)
    if not (directory / "config.json").is_file():
        return [f"model.path {path} is not a Hugging Face model directory (no config.json)"]
    problems = []
    if not any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        problems.append(f"model.path {path} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json): copy "
                        "the tokenizer files of the model into it")
    try:
        model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    except json.JSONDecodeError as exc:
        return [f"{directory / 'config.json'} is not valid JSON ({exc.msg})"]
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(directory)
    except (ValueError, KeyError, OSError) as exc:
        problems.append(f"model.path {path}: unknown architecture (model_type {model_type!r}) for this version of "
                        f"transformers: {str(exc).splitlines()[0]}")
        return problems
    if type(config) not in AutoModelForCausalLM._model_mapping:
        problems.append(f"model.path {path}: model_type {model_type!r} is not a causal language model that "
                        "transformers' AutoModelForCausalLM can build")
    return problems


def build_model(model_config):
    """(tokenizer, model source) for ``ModelConfig``: a factory, or the directory the engine loads on rank 0."""
    if model_config.path == BUILTIN_MODEL:
        from .tasks import EchoTask
        from .tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer(EchoTask.alphabet)

        def factory():
            from transformers import Qwen2Config, Qwen2ForCausalLM

            hidden = model_config.hidden_size
            return Qwen2ForCausalLM(Qwen2Config(
                vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                num_hidden_layers=model_config.layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))

        return tokenizer, factory

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # one "Loading weights" bar per rank and model is noise in the job's output
    tokenizer = AutoTokenizer.from_pretrained(model_config.path, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # The directory itself, not a factory: the engine then reads it on rank 0 only (engine/loading.py).
    return tokenizer, model_config.path
