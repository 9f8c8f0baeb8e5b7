"""engine/rl/algorithms/grpo/config.py: typed options from YAML and the command line, and overrides into the config
tree."""

import pytest

from engine.rl.algorithms.grpo.config import GRPOConfig, apply, coerce, parse_override


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


# ---------------------------------------------------------------- algorithm.* (issue 18)

def _problems(*overrides, world_size=2):
    from engine.rl.algorithms.grpo.config import build_config, check

    return check(build_config(None, None, list(overrides)), world_size)


@pytest.mark.parametrize(("overrides", "message"), [
    (["algorithm.loss_type=grpoo"], "algorithm.loss_type must be one of grpo, dapo, dr_grpo, bnpo, gspo, cispo, got "
                                    "'grpoo' (did you mean algorithm.loss_type=grpo?)"),
    (["algorithm.scale_rewards=std"], "algorithm.scale_rewards must be one of group, batch, none, got 'std'"),
    (["algorithm.loss_type=dr_grpo", "algorithm.loss_norm_length=0"], "rollout.max_new_tokens or "
                                                                      "algorithm.loss_norm_length"),
    (["algorithm.filter_groups=true", "rollout.n=1"], "algorithm.filter_groups needs rollout.n >= 2"),
    (["algorithm.overlong_buffer_len=4"], "algorithm.overlong_buffer_len=4 must be smaller than "
                                          "rollout.max_new_tokens=4"),
    (["algorithm.entropy_coeff=-0.01"], "algorithm.entropy_coeff must be >= 0, got -0.01"),
    (["algorithm.loss_type=cispo", "algorithm.clip_c=3"], "algorithm.clip_c (dual clipping) does not apply"),
    (["algorithm.clip_low=1.0"], "algorithm.clip_low must be in [0, 1)"),
    (["algorithm.max_gen_batches=0"], "algorithm.max_gen_batches must be a positive integer"),
    (["run.val_before_train=true"], "run.val_before_train needs a validation set"),
    (["run.log_samples=-1"], "run.log_samples must be >= 0"),
    (["algorithm.advantage=rlo"], "algorithm.advantage must be one of grpo, rloo, reinforce_pp, "
                                  "reinforce_pp_baseline, got 'rlo' (did you mean algorithm.advantage=rloo?)"),
    (["algorithm.multi_reward=mean"], "algorithm.multi_reward must be one of sum_then_normalize, "
                                      "normalize_then_sum, got 'mean'"),
    (["algorithm.gamma=1.5"], "algorithm.gamma must be in [0, 1], got 1.5"),
    (["algorithm.gamma=0.9"], "with algorithm.advantage=grpo set it to 1.0"),
    (["algorithm.kl_reward_coef=0.1", "algorithm.advantage=rloo"], "with algorithm.advantage=rloo use "
                                                                   "algorithm.kl_loss_coef"),
])
def test_bad_algorithm_settings_are_named(overrides, message):
    problems = _problems(*overrides)
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize("overrides", [["algorithm.advantage=rloo"], ["algorithm.advantage=reinforce_pp",
                                                                       "algorithm.gamma=0.95",
                                                                       "algorithm.kl_reward_coef=0.01"],
                                       ["algorithm.advantage=reinforce_pp_baseline",
                                        "algorithm.multi_reward=normalize_then_sum"]])
def test_every_estimator_is_valid(overrides):
    assert _problems(*overrides) == []


def test_dr_grpo_without_a_length_constant_names_the_keys():
    from engine.rl.algorithms.grpo.config import GRPOConfig, check

    config = GRPOConfig()
    config.algorithm.loss_type, config.rollout.max_new_tokens = "dr_grpo", None
    assert any("algorithm.loss_type=dr_grpo" in p and "rollout.max_new_tokens" in p for p in check(config, 1))


def test_bad_loss_type_stops_the_cli_before_any_worker(capsys, tmp_path):
    from engine.rl.algorithms.grpo.cli import main

    assert main(["algorithm.loss_type=ppo", "algorithm.scale_rewards=std", f"run.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.loss_type must be one of grpo, dapo, dr_grpo, bnpo, gspo, cispo" in err
    assert "algorithm.scale_rewards must be one of group, batch, none" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo", "gspo", "cispo"])
def test_every_loss_type_is_valid_with_the_demo_preset(loss_type):
    assert _problems(f"algorithm.loss_type={loss_type}") == []


def test_the_recipe_fills_only_what_is_unset_and_old_names_still_work():
    from engine.rl.algorithms.grpo.config import apply_loss_type, build_config
    from engine.rl.algorithms.grpo.loss_types import resolve

    config = build_config(None, None, ["algorithm.loss_type=dr_grpo", "algorithm.clip_high=0.3"])
    assert apply_loss_type(config) == []
    a = config.algorithm
    assert (a.loss_agg, a.clip_low, a.clip_high, a.scale_rewards) == ("seq-mean-token-sum-norm", 0.2, 0.3, "none")
    settings = resolve(a, max_new_tokens=config.rollout.max_new_tokens)
    assert settings.norm_length == 4 and settings.loss_mode == "vanilla" and settings.kl_loss_coef == 0.001

    config = build_config(None, None, ["algorithm.kl_coef=0.05", "algorithm.norm_by_std=false"])
    assert resolve(config.algorithm, 4).kl_loss_coef == 0.05  # without apply_loss_type too
    assert resolve(config.algorithm, 4).scale_rewards == "none"
    notices = apply_loss_type(config)
    assert any("algorithm.kl_coef is deprecated" in n and "kl_loss_coef" in n for n in notices), notices
    assert any("algorithm.norm_by_std is deprecated: using algorithm.scale_rewards=none" in n for n in notices)
    a = config.algorithm
    assert (a.kl_loss_coef, a.kl_coef, a.scale_rewards, a.norm_by_std) == (0.05, None, "none", None)
    assert (a.loss_type, a.loss_agg, a.clip_high) == ("dapo", "token-mean", 0.28)  # the default recipe
def test_keep_checkpoints_and_loggers_are_checked():
    from engine.rl.algorithms.grpo.config import check

    config = _config()
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
    from engine.rl.algorithms.grpo.config import build_config, resolved

    config = build_config(None, None, ["train.ppo_epochs=2", "train.prompts_per_update=8", "train.steps=10"])
    data = resolved(config, 4)
    assert set(data["engine"]) == {f.name for f in dataclasses.fields(EngineConfig)}
    assert data["engine"]["lr"] == 2e-3 and data["engine"]["grad_sync"] == "auto"  # the preset's and a default
    # 16 prompts x 8 responses a step, 8 prompts x 8 per update: 2 updates per epoch, 2 epochs
    assert data["derived"] == {"world_size": 4, "prompts_per_rank": 4, "sequences_per_rank": 32,
                               "sequences_per_update": 64, "micro_batch_tokens_per_rank": None,
                               "micro_batch_size_per_rank": 16, "optimizer_steps_per_step": 4,
                               "total_optimizer_steps": 40}
    assert data["engine"]["total_steps"] == 40
    assert GRPOConfig.from_dict(data).to_dict()["train"] == data["train"]  # config.json reads back


@pytest.mark.parametrize(("text", "expected"), [("auto", "auto"), ("3", 3)])
def test_nproc_on_the_command_line(text, expected):
    from engine.train.workers import parse_nproc

    assert parse_nproc(text) == expected


@pytest.mark.parametrize("text", ["0", "two", "-1"])
def test_bad_nproc_on_the_command_line(text):
    import argparse

    from engine.train.workers import parse_nproc

    with pytest.raises(argparse.ArgumentTypeError, match="must be a positive integer or auto"):
        parse_nproc(text)
def _config(*overrides):
    from engine.rl.algorithms.grpo.config import build_config

    return build_config(None, None, list(overrides))


def test_updates_per_step_do_not_depend_on_the_number_of_ranks():
    from engine.rl.algorithms.grpo.config import check, updates_per_step

    config = _config("train.prompts_per_step=16", "train.prompts_per_update=4", "train.ppo_epochs=2")
    assert [updates_per_step(config, w) for w in (1, 2, 8)] == [8, 8, 8]
    assert all(check(config, w) == [] for w in (1, 2, 8))
    legacy = _config("train.prompts_per_step=16", "rollout.n=8", "train.mini_batch_size=64")  # per rank
    assert [updates_per_step(legacy, w) for w in (1, 2)] == [2, 1]


def test_the_deprecated_per_rank_key_still_works_with_a_notice_naming_its_replacement():
    from engine.rl.algorithms.grpo.config import check, deprecation_notices

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
    from engine.rl.algorithms.grpo.config import check

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
    from engine.rl.algorithms.grpo.config import check

    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "2+2?", "answer": "4"}\n')
    config = _config(f"data.path={data}", "data.task=gsm8k", "train.micro_batch_tokens=512")
    assert any("train.micro_batch_tokens needs data.max_prompt_tokens" in p for p in check(config, 1))
    assert not any("micro_batch_tokens" in p for p in check(_config(f"data.path={data}", "data.task=gsm8k",
                                                                    "train.micro_batch_tokens=512",
                                                                    "data.max_prompt_tokens=64"), 1))


# ---------------------------------------------------------------- one pipeline for train, eval and bench (issue 24)

def test_train_eval_and_bench_go_through_one_config_pipeline(tmp_path, capsys):
    """Deprecated keys are migrated identically (same notices, same resolved algorithm) and a misspelt key is
    refused with the same message, whichever command reads the config: all go through engine.train.cli.load
    (GRPO keeps no loader of its own)."""
    import argparse
    import dataclasses
    import json

    import engine.rl.algorithms.grpo.config as grpo_config
    from engine.bench.cli import _check_grpo_settings
    from engine.grpo import cli
    from engine.train.cli import load
    from engine.train.eval_config import eval_config
    from engine.train.registry import get_recipe

    assert not hasattr(grpo_config, "load_config")  # one pipeline: the bench's second loader is gone
    recipe = get_recipe("grpo")
    deprecated = ["algorithm.kl_coef=0.05", "algorithm.norm_by_std=false"]
    expected, notices, _ = load(recipe, None, None, deprecated)
    assert len(notices) == 2 and (expected.algorithm.kl_loss_coef, expected.algorithm.kl_coef) == (0.05, None)

    assert cli.main(["--print-config", *deprecated]) == 0
    train = capsys.readouterr()
    assert json.loads(train.out)["algorithm"] == dataclasses.asdict(expected.algorithm)
    assert all(f"accel-grpo: notice: {n}" in train.err for n in notices), train.err

    model = str(tmp_path / "model")
    config, target, eval_notices = eval_config(recipe, model, overrides=deprecated)
    assert config.algorithm == expected.algorithm and config.model.path == model and target == {"model": model}
    assert eval_notices == notices

    parser = argparse.ArgumentParser(prog="accel-bench")
    _check_grpo_settings(parser, argparse.Namespace(grpo_preset=None, grpo_overrides=deprecated, nproc=2))
    err = capsys.readouterr().err
    assert all(f"accel-bench: notice: grpo: {n}" in err for n in notices), err

    message = "unknown option 'train.stepz' (did you mean train.steps?)"
    assert cli.main(["train.stepz=3"]) == 2
    assert f"accel-grpo: error: {message}" in capsys.readouterr().err
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        eval_config(recipe, model, overrides=["train.stepz=3"])
    with pytest.raises(SystemExit):
        _check_grpo_settings(parser, argparse.Namespace(grpo_preset=None, grpo_overrides=["train.stepz=3"], nproc=2))
    assert f"grpo: {message}" in capsys.readouterr().err


def test_a_run_config_is_migrated_by_the_same_pipeline_and_the_preset_is_refused_on_it(tmp_path):
    from engine.rl.algorithms.grpo.config import build_config
    from engine.train.cli import load
    from engine.train.registry import get_recipe

    recipe = get_recipe("grpo")
    old = build_config(None, None, ["algorithm.kl_coef=0.2"])  # as an older run's config.json holds it
    config_file = tmp_path / "eval.yaml"
    config_file.write_text("rollout:\n  val_n: 3\n")
    config, notices, _ = load(recipe, None, str(config_file), ["rollout.max_new_tokens=6"], base=old)
    assert (config.algorithm.kl_loss_coef, config.algorithm.kl_coef) == (0.2, None)
    assert (config.rollout.val_n, config.rollout.max_new_tokens) == (3, 6) and len(notices) == 1
    assert old.algorithm.kl_coef == 0.2  # the base is not changed
    with pytest.raises(ValueError, match="--preset is for a new config"):
        load(recipe, "h100", None, [], base=old)
