"""engine/grpo/config.py: typed options from YAML and the command line, and overrides into the config tree."""

import pytest

from engine.grpo.config import GRPOConfig, apply, coerce, parse_override


@pytest.mark.parametrize(("value", "annotation", "expected"), [
    ("1e-4", "float", 1e-4),  # YAML 1.1 reads 1e-4 as text
    ("2e3", "int", 2000),
    ("2.5e3", "int | float", 2500.0),
    (3, "float", 3.0),
    (None, "int | None", None),
    (True, "bool", True),
    ([1, 2], "tuple[int, ...] | None", (1, 2)),
    ((1, 2), "list", [1, 2]),
    (2024, "str | None", "2024"),  # run.name=2024 is a name, not a number
])
def test_coerce(value, annotation, expected):
    assert coerce("key", value, annotation) == expected


@pytest.mark.parametrize(("value", "annotation", "message"), [
    ("abc", "int", "train.steps must be an integer, got 'abc'"),
    (True, "int", "train.steps must be an integer, got True"),  # a bool is not a number here
    (1.5, "int", "train.steps must be an integer, got 1.5"),
    ("x", "float | None", "train.steps must be a number or null, got 'x'"),
])
def test_coerce_names_the_key_and_the_type(value, annotation, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        coerce("train.steps", value, annotation)


def test_parse_override_nests_keys_and_reads_values_as_yaml():
    assert parse_override("train.steps=5") == {"train": {"steps": 5}}
    assert parse_override("run.loggers=[jsonl, tensorboard]") == {"run": {"loggers": ["jsonl", "tensorboard"]}}
    assert parse_override("data.system_prompt=[x: y") == {"data": {"system_prompt": "[x: y"}}  # not YAML: text
    assert parse_override("model.path=") == {"model": {"path": None}}
    with pytest.raises(ValueError, match="must look like section.key=value"):
        parse_override("train.steps")


def test_apply_sets_typed_fields_and_names_mistakes():
    config = GRPOConfig()
    apply(config, {"train": {"steps": "7"}, "engine": {"lr": "1e-4", "custom": 1}})
    assert config.train.steps == 7 and config.engine == {"lr": 1e-4, "custom": 1}
    with pytest.raises(ValueError, match=r"unknown option 'train.stepz' \(did you mean train.steps\?\)"):
        apply(config, {"train": {"stepz": 1}})
    with pytest.raises(ValueError, match="option 'train' is a section"):
        apply(config, {"train": 3})
    with pytest.raises(ValueError, match="--preset NAME"):
        apply(config, {"preset": "h100"})
