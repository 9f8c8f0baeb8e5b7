"""Bad input to accel-grpo fails early (before any worker starts) with a message that says what to fix."""

import json

import pytest

from engine.rl.algorithms.grpo.cli import main
from engine.rl.algorithms.grpo.config import build_config, check
from engine.rl.prompts import EchoTask, echo_reward, final_number, gsm8k_reward, read_rows
from engine.rl.rewards import import_function


def run_cli(capsys, *args):
    code = main(list(args))
    return code, capsys.readouterr().err


def test_unknown_preset(capsys):
    code, err = run_cli(capsys, "--preset", "tpu-pod")
    assert code == 2 and "unknown preset 'tpu-pod'" in err and "cpu-demo" in err


def test_unknown_option_gets_a_suggestion(capsys):
    code, err = run_cli(capsys, "train.step=5")
    assert code == 2 and "unknown option 'train.step' (did you mean train.steps?)" in err


def test_unknown_engine_option(capsys):
    code, err = run_cli(capsys, "engine.fsdp_verison=2")
    assert code == 2 and "engine.fsdp_verison" in err


def test_missing_model_and_data_paths(capsys, tmp_path):
    code, err = run_cli(capsys, "--preset", "h100", "--nproc", "1")
    assert code == 2 and "needs model.path" in err and "needs data.path" in err
    code, err = run_cli(capsys, "--nproc", "1", f"model.path={tmp_path / 'nope'}", "data.task=gsm8k",
                        f"data.path={tmp_path / 'missing.jsonl'}")
    assert code == 2 and "is not a Hugging Face model directory" in err and "missing.jsonl does not exist" in err


def test_malformed_row_names_file_and_line(capsys, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n" + json.dumps({"question": "2+2?"})
                    + "\n")
    code, err = run_cli(capsys, "--preset", "cpu-demo", "--nproc", "1", "data.task=gsm8k", f"data.path={data}")
    assert code == 2 and f"{data}:2: missing or empty answer in column 'answer'" in err
    data.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"train.jsonl:1: not valid JSON"):
        read_rows(str(data))


def test_reward_that_cannot_be_imported(capsys):
    code, err = run_cli(capsys, "data.reward=no_such_module:fn")
    assert code == 2 and "data.reward 'no_such_module:fn': cannot import module 'no_such_module'" in err
    code, err = run_cli(capsys, "data.reward=engine.grpo.tasks:no_such_fn")
    assert code == 2 and "data.reward 'engine.grpo.tasks:no_such_fn': module 'engine.grpo.tasks' has no function " \
                         "'no_such_fn'; check the function's name" in err
    with pytest.raises(ValueError, match="data.reward 'just_a_name': must look like 'package.module:function'"):
        import_function("just_a_name")
    with pytest.raises(ValueError,
                       match="'CORRECT' in module 'engine.rl.validation' is not a function; name a"):
        import_function("engine.rl.validation:CORRECT")


@pytest.mark.parametrize("overrides, message", [
    (["train.prompts_per_step=5"], "train.prompts_per_step=5 does not divide over 2 ranks"),
    (["train.mini_batch_size=48"], "which train.mini_batch_size=48 does not divide"),
    (["train.prompts_per_update=5"], "train.prompts_per_update=5 does not divide train.prompts_per_step=16"),
    (["train.micro_batch_tokens=8"], "train.micro_batch_tokens=8 is smaller than the longest possible sequence"),
    (["rollout.n=1"], "rollout.n must be at least 2"),
    (["algorithm.loss_agg=mean"], "algorithm.loss_agg must be one of"),
])
def test_batch_sizes_and_algorithm_options_are_checked(overrides, message):
    problems = check(build_config(None, None, overrides), world_size=2)
    assert any(message in p for p in problems), problems


def test_yaml_file_then_overrides(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("train:\n  steps: 7\n  mini_batch_size: 32\nrollout:\n  n: 4\n")
    config = build_config("cpu-demo", str(path), ["train.steps=9"])
    assert (config.train.steps, config.rollout.n, config.preset) == (9, 4, "cpu-demo")
    assert check(config, world_size=2) == []


def test_builtin_rewards_by_hand():
    assert echo_reward("c x3:", "ccc", "ccc") == 1.0
    assert echo_reward("c x3:", "cca", "ccc") == pytest.approx(2 / 3)
    assert echo_reward("c x2:", "cccc", "cc") == 0.5  # two right out of four characters written
    assert echo_reward("c x2:", "", "cc") == 0.0
    assert final_number("so 3 + 4 = 7. #### 1,234") == "1234"
    assert final_number("The answer is 42.") == "42" and final_number("no digits") is None
    assert gsm8k_reward("q", "... the total is 18", "blah #### 18") == 1.0
    assert gsm8k_reward("q", "... the total is 17", "blah #### 18") == 0.0


def test_echo_task_prompts_match_answers():
    import torch

    for sample in EchoTask().sample(20, torch.Generator().manual_seed(0)):
        letter, count = sample.prompt[0], int(sample.prompt.split("x")[1].rstrip(":"))
        assert sample.answer == letter * count


def test_unknown_task_and_unusable_backend_fail_before_any_worker(capsys, tmp_path, monkeypatch):
    code, err = run_cli(capsys, "data.task=poetry", f"run.output_dir={tmp_path}")
    assert code == 2 and "data.task must be echo or gsm8k" in err
    monkeypatch.setenv("ACCEL_BACKEND", "no-such-device")
    code, err = run_cli(capsys, f"run.output_dir={tmp_path}")
    assert code == 2 and "unknown backend 'no-such-device'" in err
    assert list(tmp_path.iterdir()) == [], "nothing is written for a run that cannot start"


def test_resume_without_a_checkpoint(capsys, tmp_path):
    code, err = run_cli(capsys, "--resume", "run.name=typo", f"run.output_dir={tmp_path}")
    assert code == 2 and "--resume: no checkpoint in" in err
    assert not (tmp_path / "typo").exists()


def test_preset_is_chosen_with_the_flag_and_flags_mix_with_overrides(capsys):
    code, err = run_cli(capsys, "preset=h100")
    assert code == 2 and "choose the preset with --preset" in err
    code = main(["train.steps=3", "--preset", "cpu-demo", "rollout.n=4", "--print-config", "--nproc", "auto",
                 "train.mini_batch_size=32"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["preset"] == "cpu-demo" and printed["train"]["steps"] == 3
    assert printed["rollout"]["n"] == 4 and printed["rollout"]["max_new_tokens"] == 4
    assert printed["nproc"] == "auto" and printed["derived"]["world_size"] == 2  # auto: 2 on the CPU backend
    # --print-config checks first: a preset that needs paths says so instead of printing
    code, err = run_cli(capsys, "--preset", "h100", "--print-config")
    assert code == 2 and "needs model.path" in err
