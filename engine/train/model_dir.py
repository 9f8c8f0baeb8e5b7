"""Is a local path a Hugging Face causal-LM directory this transformers can build? Asked before any worker starts."""

from __future__ import annotations

import json


def check_model_dir(path: str, key: str = "model.path") -> list[str]:
    """Problems with a model directory (or a Hub name in the local cache) that would otherwise surface as
    tracebacks inside every worker."""
    from .hub_names import hub_problem, local_model_dir

    if hub_problem(path, key):
        return [hub_problem(path, key)]
    directory = local_model_dir(path)
    if not (directory / "config.json").is_file():
        return [f"{key} {path} is not a Hugging Face model directory (no config.json)"]
    problems = []
    if not any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        problems.append(f"{key} {path} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json): copy "
                        "the tokenizer files of the model into it")
    try:
        model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    except json.JSONDecodeError as exc:
        return [f"{directory / 'config.json'} is not valid JSON ({exc.msg})"]
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..checkpoint import pickled_weights_problems

    problems += pickled_weights_problems(directory, None if key == "model.path" else key)  # planted: one line
    try:
        config = AutoConfig.from_pretrained(directory)
    except (ValueError, KeyError, OSError) as exc:
        problems.append(f"{key} {path}: unknown architecture (model_type {model_type!r}) for this version of "
                        f"transformers: {str(exc).splitlines()[0]}")
        return problems
    if type(config) not in AutoModelForCausalLM._model_mapping:
        problems.append(f"{key} {path}: model_type {model_type!r} is not a causal language model that "
                        "transformers' AutoModelForCausalLM can build")
    return problems
