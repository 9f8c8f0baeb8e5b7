"""What an exported model remembers of how its run prompted it: the system prompt, the chat-template choice and the
generation limit it trained with (``Recipe.prompt_settings``).

``export`` writes them where each reader looks: ``generation_config.json``'s ``max_new_tokens`` (transformers'
``generate``), the tokenizer's chat template with the system prompt as its default (``apply_chat_template`` of a
conversation without a system message), and ``accel_prompting.json`` (all three, by name). A run or an ``eval``
started from such a directory takes them for the options the recipe maps them to (``Recipe.prompt_keys``) that its
file and overrides leave out, and says so in a notice."""

from __future__ import annotations

import json
import re
from pathlib import Path

RECORD = "accel_prompting.json"
SETTINGS = ("system_prompt", "chat_template", "max_new_tokens")
_WRAPPER = re.compile(r"\{#- accel-prompting -#\}.*?\{#- /accel-prompting -#\}\n?", re.DOTALL)


def remembered(model_path) -> dict:
    """The prompt settings a model directory remembers ({} for any other directory, or a built-in model)."""
    if not isinstance(model_path, str) or model_path.startswith("builtin:"):
        return {}
    path = Path(model_path) / RECORD
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {key: data[key] for key in SETTINGS if data.get(key) is not None}


def _given(option: str, given: list[dict]) -> bool:
    for data in given:
        cursor = data
        for part in option.split("."):
            if not isinstance(cursor, dict) or part not in cursor:
                break
            cursor = cursor[part]
        else:
            return True
    return False


def fill(config, keys: dict[str, str], given: list[dict]) -> list[str]:
    """Set the options ``keys`` maps the model directory's remembered settings to, where ``given`` (the file and
    the overrides, parsed) does not set them; the notice that says so."""
    from .config import apply

    model = getattr(config, "model", None)
    settings = remembered(getattr(model, "path", None))
    used = []
    for name, option in keys.items():
        if name in settings and not _given(option, given) and _current(config, option) != settings[name]:
            nested = settings[name]
            for part in reversed(option.split(".")):
                nested = {part: nested}
            apply(config, nested)
            used.append(f"{option}={_short(settings[name])}")
    if not used:
        return []
    return [f"model.path {model.path} remembers how it was trained to be prompted ({RECORD}): using "
            f"{', '.join(used)} (set an option to change it)"]


def _current(config, option: str):
    for part in option.split("."):
        config = getattr(config, part, None)
    return config


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + '..."'


def with_system_prompt(template: str, system_prompt: str) -> str:
    """``template`` that puts ``system_prompt`` first in a conversation that has no system message (an earlier
    such default replaced)."""
    template = _WRAPPER.sub("", template)
    literal = json.dumps(system_prompt)  # a Jinja string literal: the same escapes as JSON's
    return ("{#- accel-prompting -#}{%- if messages and messages[0]['role'] != 'system' %}{%- set messages = "
            f"[{{'role': 'system', 'content': {literal}}}] + messages %}}{{%- endif %}}{{#- /accel-prompting -#}}\n"
            + template)


def write(directory: Path, settings: dict) -> None:
    """Write ``settings`` (``Recipe.prompt_settings``) into the model directory: the record, the generation
    config's ``max_new_tokens``, and the system prompt as the chat template's default."""
    settings = {key: settings[key] for key in SETTINGS if settings.get(key) is not None}
    if not settings:
        return
    directory = Path(directory)
    (directory / RECORD).write_text(json.dumps(settings, indent=2) + "\n")
    if "max_new_tokens" in settings:
        path = directory / "generation_config.json"
        generation = json.loads(path.read_text()) if path.is_file() else {}
        generation["max_new_tokens"] = settings["max_new_tokens"]
        path.write_text(json.dumps(generation, indent=2) + "\n")
    system = settings.get("system_prompt")
    if system and settings.get("chat_template", "auto") == "auto":
        _set_default_system(directory, system)


def _set_default_system(directory: Path, system: str) -> None:
    """The chat template wherever the tokenizer files hold one (``chat_template.jinja``, ``tokenizer_config.json``)."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        jinja.write_text(with_system_prompt(jinja.read_text(), system))
    config_file = directory / "tokenizer_config.json"
    if config_file.is_file():
        data = json.loads(config_file.read_text())
        if isinstance(data.get("chat_template"), str):
            data["chat_template"] = with_system_prompt(data["chat_template"], system)
            config_file.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
