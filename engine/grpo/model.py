"""The policy's tokenizer and model source: the built-in character model's factory, or a local HF directory."""

from __future__ import annotations

import json
from pathlib import Path

from ..tiny_model import tiny_qwen2

BUILTIN_MODEL = "builtin:tiny-char"  # model.path of the CPU demo's character model, built in code


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
