"""The types prompt data flows in: a run's ``DataSpec`` (resolved once from its config) and each prompt's
``Sample``."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What a run reads, resolved once from its config (``data_spec``) and passed down: its prompt files, how a row
    becomes a prompt, and its reward functions. ``data.py`` and ``rewards.py`` take these as arguments and never see
    the config, so inputs load in one direction: config -> spec -> rewards -> prompts."""

    path: str | None = None
    val_path: str | None = None
    val_fraction: float = 0.0
    prompt_key: str | None = None
    answer_key: str | None = None
    chat_template: str = "auto"
    system_prompt: str | None = None
    max_prompt_tokens: int | None = None
    seed: int = 0  # of the data.val_fraction split
    rewards: tuple[tuple[str, float], ...] = ()  # (module:function, weight): data.reward, else the task's own
    reward_style: str = "auto"


@dataclasses.dataclass(frozen=True)
class Sample:
    """One prompt: what the model sees (``prompt``, the chat template applied) and what rewards read."""

    prompt: str
    answer: str | None = None
    raw_prompt: Any = None  # the row's prompt as in the file: text or a list of chat messages
    data_source: str = ""
    extra_info: Any = None
    row: dict = dataclasses.field(default_factory=dict, compare=False)  # all columns (TRL rewards get them)
    where: str = ""  # file:row, for error messages
