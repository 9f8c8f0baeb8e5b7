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


def test_keep_checkpoints_and_loggers_are_checked():
    from engine.grpo.config import check

    config = GRPOConfig()
    config.run.keep_checkpoints, config.run.loggers = 0, ["jsonl", "wandbb", "mlflow"]
    problems = check(config, 2)
    assert any(p.startswith("run.keep_checkpoints must be a positive integer") and p.endswith("got 0")
               for p in problems), problems
    assert any(p.startswith("run.loggers: unknown logger 'wandbb' (did you mean wandb?)") for p in problems)
    config.run.keep_checkpoints, config.run.loggers = 3, ["wandb", "tensorboard"]
    assert check(config, 2) == []


def test_resolved_config_has_every_engine_default_and_the_derived_sizes():
    import dataclasses

    from engine import EngineConfig
    from engine.grpo.config import build_config, resolved

    config = build_config(None, None, ["train.ppo_epochs=2", "train.mini_batch_size=16", "train.steps=10"])
    data = resolved(config, 4)
    assert set(data["engine"]) == {f.name for f in dataclasses.fields(EngineConfig)}
    assert data["engine"]["lr"] == 2e-3 and data["engine"]["grad_sync"] == "auto"  # the preset's and a default
    assert data["derived"] == {"world_size": 4, "prompts_per_rank": 4, "sequences_per_rank": 32,
                               "mini_batch_size_per_rank": 16, "micro_batch_size_per_rank": 16,
                               "micro_batches_per_update": 1, "optimizer_steps_per_step": 4,
                               "total_optimizer_steps": 40}
    assert data["engine"]["total_steps"] == 40
    assert GRPOConfig.from_dict(data).to_dict()["train"] == data["train"]  # config.json reads back


@pytest.mark.parametrize(("text", "expected"), [("auto", "auto"), ("3", 3)])
def test_nproc_on_the_command_line(text, expected):
    from engine.grpo.workers import parse_nproc

    assert parse_nproc(text) == expected


@pytest.mark.parametrize("text", ["0", "two", "-1"])
def test_bad_nproc_on_the_command_line(text):
    import argparse

    from engine.grpo.workers import parse_nproc

    with pytest.raises(argparse.ArgumentTypeError, match="must be a positive integer or auto"):
        parse_nproc(text)
