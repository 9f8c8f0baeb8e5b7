"""``critic.path`` checked before any worker starts, each problem one sentence naming the key: a path that is not a
model directory (in a worker it would become a Hub lookup that never names the key), an architecture no value head
fits (``AutoModelForTokenClassification``), and a vocabulary other than the policy's: the critic reads the policy's
token ids, so an id past its embeddings is an ``IndexError`` deep in a forward, and a different mapping gives values
of other tokens."""

from __future__ import annotations

import json
from pathlib import Path


def path_problems(path: str | None) -> list[str]:
    """``critic.path`` on its own: a model directory whose architecture takes a value head."""
    if path is None:
        return []
    from ....train.hub_names import hub_problem, local_model_dir

    if hub_problem(path, "critic.path"):
        return [hub_problem(path, "critic.path")]
    directory = local_model_dir(path)
    if not (directory / "config.json").is_file():
        what = "does not exist" if not directory.exists() else "has no config.json"
        return [f"critic.path {path} {what}: give a model directory (a causal LM of the policy's family, or a "
                "critic saved before), or leave critic.path unset for a value head on the policy's model"]
    try:
        model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    except (OSError, ValueError) as exc:
        return [f"critic.path {path}: its config.json is not valid JSON ({exc})"]
    from transformers import AutoConfig, AutoModelForTokenClassification

    try:
        config = AutoConfig.from_pretrained(directory)
    except (ValueError, KeyError, OSError) as exc:
        return [f"critic.path {path}: unknown architecture (model_type {model_type!r}) for this version of "
                f"transformers: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]
    if type(config) not in AutoModelForTokenClassification._model_mapping:
        return [f"critic.path {path}: model_type {model_type!r} takes no value head (transformers' "
                "AutoModelForTokenClassification cannot build it): give a causal LM of a supported family"]
    return []


def vocabulary_problem(path: str, policy_tokenizer) -> str | None:
    """One sentence when ``critic.path`` does not read the policy's token ids as the policy does: its own tokenizer
    (when it has one) maps tokens differently, or its embeddings hold fewer ids than the policy's tokenizer."""
    from transformers import AutoConfig

    size = getattr(AutoConfig.from_pretrained(path).get_text_config(), "vocab_size", None)
    ids = len(policy_tokenizer)
    if isinstance(size, int) and size < ids:
        return (f"critic.path {path} has {size} token embeddings but the policy's tokenizer has {ids} tokens: the "
                "critic reads the policy's token ids, so it must share the policy's vocabulary (a model of the same "
                "family)")
    if any((Path(path) / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        from transformers import AutoTokenizer

        theirs = AutoTokenizer.from_pretrained(path).get_vocab()
        mine = policy_tokenizer.get_vocab()
        if theirs != mine:
            differ = len(set(mine.items()) ^ set(theirs.items()))
            return (f"critic.path {path} has a tokenizer that differs from the policy's ({len(theirs)} tokens against "
                    f"{len(mine)}; {differ} entries differ): the critic reads the policy's token ids, so it must "
                    "share the policy's vocabulary (a model of the same family)")
    return None


def critic_problems(config) -> list[str]:
    """``critic.path`` against the policy (read once, in the launcher), after the keys' own checks held."""
    if not config.critic.path:
        return []
    from ...model import build_model

    problem = vocabulary_problem(config.critic.path, build_model(config.model)[0])
    return [problem] if problem else []
