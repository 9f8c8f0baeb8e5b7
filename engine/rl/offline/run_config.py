"""What the offline recipes' configs (SFT, DPO, reward models) share: the engine's options, config.json's content,
and the checks of the model, the paths and the batch sizes, one sentence per problem."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...config import EngineConfig
from ...sequence_parallel import config_problems
from ...train import config as train_config
from ...train.settings import missing_model
from .model_files import DEMO_MODEL


def engine_config(config, total_steps: int | None = None) -> EngineConfig:
    """The engine's options: ``engine.*``, with the seed and (for the LR schedule) the run's optimizer steps."""
    defaults: dict[str, Any] = {"seed": config.train.seed}
    if total_steps is not None:
        defaults["total_steps"] = total_steps
    return train_config.engine_options(dict(config.engine), defaults)


def resolved(config, derived: dict | None = None) -> dict:
    """Every option, every engine default, and the values that follow from the data (when known)."""
    data = config.to_dict()
    data["engine"] = dataclasses.asdict(engine_config(config, (derived or {}).get("total_steps")))
    if derived:
        data["derived"] = derived
    return data


def positive(name: str, value, optional: bool = False) -> list[str]:
    """``name`` must be a positive integer (or null when ``optional``)."""
    if optional and value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return [f"{name} must be a positive integer{' or null' if optional else ''}, got {value!r}"]
    return []


def input_problems(config) -> list[str]:
    """The model directory and the data files."""
    problems = []
    if config.model.path is None:
        problems.append(missing_model(config.preset))
    elif config.model.path != DEMO_MODEL:
        from ...train.model_dir import check_model_dir

        problems += check_model_dir(config.model.path)
    for key, path in (("data.path", config.data.path), ("data.val_path", config.data.val_path)):
        if path and not Path(path).exists():
            problems.append(f"{key} {path} does not exist")
    if not 0 <= config.data.val_fraction < 1:
        problems.append(f"data.val_fraction must be in [0, 1), got {config.data.val_fraction}")
    return problems


def sizing_problems(config, world_size: int, *, unit_tokens: int, unit: str, items: str) -> list[str]:
    """The batch sizes against the largest item (``unit``, of ``unit_tokens`` tokens), the ranks and the engine's
    options; ``items``: what ``train.batch_size`` counts."""
    problems = []
    t = config.train
    if t.micro_batch_tokens is not None and t.micro_batch_tokens < unit_tokens:
        problems.append(f"train.micro_batch_tokens={t.micro_batch_tokens} is below {unit} ({unit_tokens} tokens), "
                        f"which could then never run: raise train.micro_batch_tokens to at least {unit_tokens} or "
                        "lower data.max_length")
    if t.batch_tokens is not None and t.batch_tokens < unit_tokens:
        problems.append(f"train.batch_tokens={t.batch_tokens} is below {unit} ({unit_tokens} tokens): raise it to "
                        f"at least {unit_tokens}")
    sp = config.engine.get("sequence_parallel_size", 1)
    if isinstance(sp, int) and not isinstance(sp, bool) and sp > 1:  # the rest of sp's checks: engine_config below
        problems += config_problems(sp, world_size)  # with the defaults: only whether sp divides the world
    groups = train_config.data_parallel_groups(config.engine, world_size)
    if t.batch_tokens is None and t.batch_size < groups:
        who = f"{groups} ranks" if groups == world_size else f"{groups} data-parallel groups"
        problems.append(f"train.batch_size={t.batch_size} {items} per step cannot give each of the {who} one: "
                        f"raise train.batch_size to at least {groups}")
    if str(config.engine.get("mixed_precision", "")) == "fp16":
        problems.append("engine.mixed_precision=fp16 is not supported (no loss scaling): use bf16 (or auto)")
    try:
        engine_config(config, t.steps or 1)  # the real count follows from the data
    except (ValueError, TypeError) as exc:
        problems.append(str(exc))
    return problems
