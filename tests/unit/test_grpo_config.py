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


def _config(*overrides):
    from engine.grpo.config import build_config

    return build_config(None, None, list(overrides))


def test_updates_per_step_do_not_depend_on_the_number_of_ranks():
    from engine.grpo.config import check, updates_per_step

    config = _config("train.prompts_per_step=16", "train.prompts_per_update=4", "train.ppo_epochs=2")
    assert [updates_per_step(config, w) for w in (1, 2, 8)] == [8, 8, 8]
    assert all(check(config, w) == [] for w in (1, 2, 8))
    legacy = _config("train.prompts_per_step=16", "rollout.n=8", "train.mini_batch_size=64")  # per rank
    assert [updates_per_step(legacy, w) for w in (1, 2)] == [2, 1]


def test_the_deprecated_per_rank_key_still_works_with_a_notice_naming_its_replacement():
    from engine.grpo.config import check, deprecation_notices

    legacy = _config("train.prompts_per_step=16", "rollout.n=8", "train.mini_batch_size=32")
    assert check(legacy, 2) == []
    (notice,) = deprecation_notices(legacy, 2)
    assert "train.mini_batch_size" in notice and "train.prompts_per_update" in notice and "(8 here on 2" in notice
    assert deprecation_notices(_config(), 2) == []
    both = _config("train.mini_batch_size=32", "train.prompts_per_update=8")
    assert any("not both" in p for p in check(both, 2))
    assert any("train.mini_batch_size=48 does not divide" in p for p in check(_config("train.mini_batch_size=48"), 2))
    assert any("train.prompts_per_update=5 does not divide train.prompts_per_step=16" in p
               for p in check(_config("train.prompts_per_update=5"), 2))


@pytest.mark.parametrize("padding_free", ["true", "false"])
def test_a_token_budget_below_the_longest_sequence_is_refused_naming_both_numbers(padding_free):
    from engine.grpo.config import check

    fits = _config("data.max_prompt_tokens=100", "rollout.max_new_tokens=28", "train.micro_batch_tokens=128",
                   f"train.padding_free={padding_free}")
    assert check(fits, 2) == []  # padding_free=false: the budget forms padded micro-batches (rows x longest)
    small = _config("data.max_prompt_tokens=100", "rollout.max_new_tokens=28", "train.micro_batch_tokens=127")
    (problem,) = check(small, 2)
    assert "train.micro_batch_tokens=127 is smaller than the longest possible sequence, 128 tokens" in problem
    assert "prompt limit 100 + rollout.max_new_tokens 28" in problem
    echo = _config("rollout.max_new_tokens=4", "train.micro_batch_tokens=8")  # echo prompts: at most 5 tokens
    assert "9 tokens (prompt limit 5 + rollout.max_new_tokens 4)" in check(echo, 2)[0]


def test_a_token_budget_needs_a_prompt_limit_for_data_files(tmp_path):
    from engine.grpo.config import check

    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "2+2?", "answer": "4"}\n')
    config = _config(f"data.path={data}", "data.task=gsm8k", "train.micro_batch_tokens=512")
    assert any("train.micro_batch_tokens needs data.max_prompt_tokens" in p for p in check(config, 1))
    assert not any("micro_batch_tokens" in p for p in check(_config(f"data.path={data}", "data.task=gsm8k",
                                                                    "train.micro_batch_tokens=512",
                                                                    "data.max_prompt_tokens=64"), 1))
