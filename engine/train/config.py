"""The config pipeline every trainer's command goes through: a preset, then a YAML file, then ``key=value``
overrides, onto the trainer's own dataclass schema; values coerced to the field's type, unknown keys named with the
closest valid one. The schema, presets, key migrations and checks stay with each recipe (its ``config.py``); the
commands run the pipeline through ``cli.load``."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from accel_backends.names import did_you_mean

from ..config import EngineConfig


class ConfigRoot:
    """What a trainer's config root (a dataclass with a ``preset`` field) shares: to and from a plain dict."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict):
        """From ``to_dict()`` or a run's ``config.json`` (its ``derived`` section is computed, not read)."""
        data = dict(data)
        data.pop("derived", None)
        data.pop("trainer", None)  # the schema's own (a run from before it was recorded has none)
        config = cls(preset=data.pop("preset", "cpu-demo"))
        apply(config, data)
        return config


def apply(config: Any, data: dict, prefix: str = "") -> None:
    """Set fields from a nested mapping; an unknown key is named with the closest valid one."""
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(config, dict):  # the engine section: EngineConfig's fields (unknown ones are named later)
            engine_fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
            config[key] = coerce(name, value, engine_fields[key].type) if key in engine_fields else value
            continue
        fields = {f.name: f for f in dataclasses.fields(config)}
        if key not in fields:
            raise ValueError(f"unknown option {name!r}{did_you_mean(key, fields, prefix)}")
        if key == "preset" and not prefix:
            raise ValueError("choose the preset with --preset NAME (setting it here would not load its values)")
        current = getattr(config, key)
        if dataclasses.is_dataclass(current) or isinstance(current, dict):
            if not isinstance(value, dict):
                raise ValueError(f"option {name!r} is a section: set its fields, e.g. {name}.<field>=...")
            apply(current, value, prefix=f"{name}.")
        else:
            setattr(config, key, coerce(name, value, fields[key].type))


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "text", "None": "null"}


def coerce(name: str, value: Any, annotation: str) -> Any:
    """``value`` as the type ``annotation`` names, or a ValueError naming the key and the type expected.

    YAML 1.1 reads ``1e-4`` as text: a numeric field takes any number written in scientific notation.
    """
    kinds = [kind.strip() for kind in str(annotation).split("|")]
    if isinstance(value, str) and {"int", "float"} & set(kinds) and _NUMBER.fullmatch(value.strip()):
        number = float(value)
        value = int(number) if "float" not in kinds and number.is_integer() else number
    for kind in kinds:
        if kind == "None" and value is None:
            return None
        if kind == "bool" and isinstance(value, bool):
            return value
        if isinstance(value, bool):
            continue
        if kind == "int" and isinstance(value, int):
            return value
        if kind == "float" and isinstance(value, (int, float)):
            return float(value)
        if kind == "str" and isinstance(value, str):
            return value
        if kind.startswith(("tuple", "list")) and isinstance(value, (list, tuple)):
            return tuple(value) if kind.startswith("tuple") else list(value)
    if "str" in kinds and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # run.name=2024 is a name, not a number
    expected = " or ".join(_TYPE_NAMES.get(k, "a list" if k.startswith(("tuple", "list")) else k) for k in kinds)
    raise ValueError(f"{name} must be {expected}, got {value!r}")


def parse_override(text: str) -> dict:
    """``train.steps=5`` -> ``{"train": {"steps": 5}}`` (values parsed as YAML: numbers, booleans, null)."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} must look like section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw  # e.g. a value with a colon: kept as text, checked against the option's type
    nested: dict = {}
    cursor = nested
    parts = key.strip().split(".")
    for part in parts[:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[parts[-1]] = value
    return nested


def read_config_file(config_file: str) -> dict:
    """A YAML file of sections, or a ValueError / FileNotFoundError naming the file (and the line) at fault."""
    import yaml

    path = Path(config_file)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise ValueError(f"config file {path} is not valid YAML{line}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"config file {path} must hold a mapping of sections")
    return loaded


DEMO_PRESET = "cpu-demo"  # the demo: no model and no data given
DEFAULT_PRESET = "default"  # the library's defaults: a user's own model or data


def choose_preset(presets: dict[str, dict], named: str | None, file_data: dict,
                  overrides: list[str]) -> tuple[str, str]:
    """The preset a command uses and why: the one named; else the library defaults when the user gave a model or
    data (in the file or the overrides), the demo when neither."""
    if named:
        if named not in presets:
            raise ValueError(f"unknown preset {named!r}: choose one of {', '.join(presets)}")
        return named, "named with --preset"
    given = [dict(file_data)] + [parse_override(o) for o in overrides]
    own = sorted({f"{section}.path" for data in given for section in ("model", "data")
                  if isinstance(data.get(section), dict) and data[section].get("path") is not None})
    if own and DEFAULT_PRESET in presets:
        return DEFAULT_PRESET, (f"the library defaults: {' and '.join(own)} given and no --preset (--preset "
                                f"{DEMO_PRESET} for the demo's settings)")
    return DEMO_PRESET, "the demo: no --preset, no model.path and no data.path given"


def build_config(schema: type, presets: dict[str, dict], preset: str | None, config_file: str | None,
                 overrides: list[str], default_preset: str = DEMO_PRESET):
    """``schema(preset=...)``, then the preset's values, then the YAML file, then the overrides, in that order.
    ``preset`` None: ``default_preset`` (the commands choose with ``choose_preset``)."""
    name = preset or default_preset
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(presets)}")
    config = schema(preset=name)
    apply(config, presets[name])
    if config_file:
        apply(config, read_config_file(config_file))
    for override in overrides:
        apply(config, parse_override(override))
    return config


def resolve_paths(config, keys) -> None:
    """Every path option in ``keys`` (``model.path``) made absolute against the directory the command runs in, so
    that workers and servers started elsewhere read the same files; built-in names (``builtin:...``), nulls and
    keys the schema lacks are left alone."""
    for key in keys:
        *sections, name = key.split(".")
        holder = config
        for section in sections:
            holder = getattr(holder, section, None)
        value = getattr(holder, name, None) if holder is not None else None
        if isinstance(value, str) and value and not value.startswith("builtin:"):
            setattr(holder, name, os.path.abspath(os.path.expanduser(value)))


def dist_timeout_s(config) -> float:
    """The process-group timeout of a run: ``engine.dist_timeout_s`` or the engine's default (the group is made
    before the engine, so every trainer reads it here)."""
    value = config.engine.get("dist_timeout_s", EngineConfig.dist_timeout_s)
    return coerce("engine.dist_timeout_s", value, "float")


def require_valid(problems: list[str]) -> None:
    """A config check's problems as one ValueError: one line for one problem, a list for several."""
    if problems:
        raise ValueError("invalid configuration: " + problems[0] if len(problems) == 1 else
                         "invalid configuration:\n  - " + "\n  - ".join(problems))


def engine_options(options: dict, defaults: dict) -> EngineConfig:
    """``EngineConfig`` from a run's ``engine`` section (``defaults`` fill what it leaves out); an unknown option is
    named with the closest valid one and the list of valid ones."""
    options = {**defaults, **options}
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        hints = "".join(did_you_mean(u, fields, "engine.") for u in unknown[:1])
        raise ValueError(f"unknown engine option(s) {', '.join('engine.' + u for u in unknown)}{hints}; valid: "
                         f"{', '.join(sorted(fields))}")
    options = {key: coerce(f"engine.{key}", value, fields[key].type) for key, value in options.items()}
    return EngineConfig(**options)


def data_parallel_groups(engine: dict, world_size: int) -> int:
    """Groups that each take their own prompts or micro-batches: ``world / engine.sequence_parallel_size`` (the
    ranks of one sequence-parallel group share theirs). A size that does not divide the world counts as 1 here:
    the engine's options check refuses it."""
    sp = engine.get("sequence_parallel_size", 1)
    valid = isinstance(sp, int) and not isinstance(sp, bool) and sp >= 1 and world_size % sp == 0
    return world_size // sp if valid else world_size
