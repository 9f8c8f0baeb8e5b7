"""Is a local path a Hugging Face causal-LM directory this transformers can build? Asked before any worker starts."""

from __future__ import annotations

import json
from pathlib import Path


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

    from ..checkpoint import pickled_weights_problems

    problems += pickled_weights_problems(directory, None)  # a planted pytorch_model.bin: one line, before workers
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
