"""Real-model inputs, in one process: the fixture model, data files in verl's and TRL's layouts, chat templates,
reward styles, and every bad input of issue 7 failing before any worker starts with a message that says what to do."""

import json
import shutil
import sys

import pytest
from grpo_data import QUESTIONS, fixture_model, verl_rows, write_datasets_dir, write_jsonl, write_parquet

from engine.rl.algorithms.grpo.cli import main
from engine.rl.algorithms.grpo.config import build_config, check
from engine.rl.prompts import PromptFormatter, load_samples, read_rows
from engine.rl.rewards import detect_style, load_rewards, parse_specs, score_all


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return fixture_model(tmp_path_factory.mktemp("fixture") / "tiny-qwen")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def run_cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.err, captured.out


def test_fixture_looks_like_qwen2_5_instruct(model_dir, tokenizer):
    generation = json.loads((model_dir / "generation_config.json").read_text())
    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert generation["eos_token_id"] == eos and generation["repetition_penalty"] == 1.05
    assert generation["top_k"] == 20 and generation["do_sample"] is True
    assert 1000 < len(tokenizer) <= 4096 and tokenizer.eos_token == "<|im_end|>"
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "How many apples?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHow many apples?<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer("Tom buys 12 apples", add_special_tokens=False)["input_ids"]
    assert len(ids) < len("Tom buys 12 apples") and tokenizer.decode(ids) == "Tom buys 12 apples"  # real BPE merges


def test_make_tiny_model_command(tmp_path, capsys):
    code, _, out = run_cli(capsys, "make-tiny-model", str(tmp_path / "m"), "--layers", "1")
    assert code == 0 and "wrote" in out and (tmp_path / "m" / "config.json").is_file()
    assert json.loads((tmp_path / "m" / "config.json").read_text())["num_hidden_layers"] == 1


def test_every_file_format_and_layout(tmp_path, tokenizer):
    formatter = PromptFormatter(tokenizer, "auto", system_prompt="Reason step by step.")
    verl = verl_rows()
    files = {"parquet": write_parquet(tmp_path / "train.parquet", verl),
             "datasets": write_datasets_dir(tmp_path / "ds", verl),
             "jsonl": write_jsonl(tmp_path / "train.jsonl", verl)}
    (tmp_path / "train.json").write_text(json.dumps(verl))
    files["json"] = tmp_path / "train.json"
    for kind, path in files.items():
        samples = load_samples(str(path), formatter)
        assert len(samples) == len(QUESTIONS), kind
        first = samples[0]
        assert first.answer == QUESTIONS[0][1] and first.data_source == "openai/gsm8k", kind
        assert first.extra_info == {"split": "train", "index": 0}, kind
        assert first.prompt.startswith("<|im_start|>system\nReason step by step.<|im_end|>\n<|im_start|>user\n")
        assert first.prompt.endswith("<|im_start|>assistant\n") and QUESTIONS[0][0] in first.prompt
    # GSM8K's own JSONL (question/answer) and TRL's text prompts with extra columns, as they are.
    gsm8k = write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": q, "answer": f"... #### {a}"} for q, a in QUESTIONS])
    assert load_samples(str(gsm8k), formatter)[1].answer.endswith("#### 9")
    plain = PromptFormatter(tokenizer, "none")
    assert load_samples(str(gsm8k), plain)[0].prompt.startswith("Question: Tom has 2 apples")
    trl = write_jsonl(tmp_path / "trl.jsonl", [{"prompt": q, "solution": a, "level": 1} for q, a in QUESTIONS])
    sample = load_samples(str(trl), formatter, need_answer=False)[0]
    assert sample.answer == "5" and sample.row["level"] == 1 and sample.raw_prompt == QUESTIONS[0][0]


@pytest.mark.parametrize("rows, message", [
    ([{"question": "q?", "answer": "1"}, {"question": "", "answer": "2"}], ":2: empty prompt in column 'question'"),
    ([{"prompt": [{"role": "user"}], "answer": "1"}], ":1: prompt messages must be objects with string 'role'"),
    ([{"text": "q?", "answer": "1"}], "no prompt column prompt or question or problem (columns: answer, text); "
                                      "set data.prompt_key"),
    ([{"prompt": "q?", "answer": "1"}, {"prompt": "r?", "answer": None}], ":2: missing or empty answer"),
    ([{"prompt": 3, "answer": "1"}], ":1: column 'prompt' must be text or a list of chat messages, got int"),
])
def test_malformed_rows_name_file_row_and_problem(tmp_path, tokenizer, rows, message):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match="bad.jsonl") as error:
        load_samples(str(path), PromptFormatter(tokenizer))
    assert message in str(error.value)


def test_unreadable_parquet_and_template_absent(tmp_path, tokenizer):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ValueError, match="broken.parquet: not a readable Parquet file"):
        read_rows(str(broken))
    messages = write_parquet(tmp_path / "m.parquet", verl_rows())
    with pytest.raises(ValueError, match="list of chat messages but the tokenizer has no chat template"):
        load_samples(str(messages), PromptFormatter(tokenizer, "none"))


def test_reward_styles_by_signature_weights_and_failures():
    import grpo_rewards

    from engine.rl.prompts import Sample

    assert detect_style(grpo_rewards.compute_score, "x") == "verl"
    assert detect_style(grpo_rewards.length_penalty, "x") == "trl"
    assert detect_style(grpo_rewards.short_reply, "x") == "simple"
    with pytest.raises(ValueError, match=r"wrong_signature\(text\) fits no reward style"):
        detect_style(grpo_rewards.wrong_signature, "grpo_rewards:wrong_signature")
    rewards = load_rewards(parse_specs(["grpo_rewards:compute_score", "grpo_rewards:length_penalty"], [1.0, 0.5]))
    row = verl_rows()[0]
    sample = Sample(prompt="p", answer="5", raw_prompt=row["prompt"], data_source="openai/gsm8k",
                    extra_info=row["extra_info"], row=row, where="train.parquet:1")
    scores = score_all(rewards, [sample, sample], ["so 5", "it is 7"])
    assert scores == pytest.approx([1.0 - 0.5 * 4 / 100, 0.0 - 0.5 * 7 / 100])
    explode = load_rewards(parse_specs("grpo_rewards:explode_on_rank1", None))
    import os

    os.environ["RANK"] = "1"
    try:
        with pytest.raises(RuntimeError, match=r"explode_on_rank1 raised RuntimeError: reward service unreachable "
                                               r"\(row train.parquet:1, prompt 'p'\)"):
            score_all(explode, [sample], ["x"])
    finally:
        del os.environ["RANK"]
    with pytest.raises(ValueError, match="data.reward_weights has 1 entries for 2"):
        parse_specs(["a:b", "c:d"], [1.0])


def test_scientific_notation_and_typed_options(capsys):
    config = build_config(None, None, ["engine.lr=1e-4", "train.steps=1e2", "rollout.temperature=7e-1"])
    assert config.engine["lr"] == 1e-4 and check(config, 2) == []
    from engine.rl.algorithms.grpo.config import engine_config

    assert engine_config(config, 2).lr == 1e-4 and config.train.steps == 100 and config.rollout.temperature == 0.7
    code, err, _ = run_cli(capsys, "train.steps=abc")
    assert code == 2 and "train.steps must be an integer, got 'abc'" in err and "Traceback" not in err
    code, err, _ = run_cli(capsys, "engine.lr=fast")
    assert code == 2 and "engine.lr must be a number, got 'fast'" in err
    code, err, _ = run_cli(capsys, "rollout.top_p=2")
    assert code == 2 and "rollout.top_p must be in (0, 1]" in err
    code, err, _ = run_cli(capsys, "engine.mixed_precision=fp16")
    assert code == 2 and "use engine.mixed_precision=bf16" in err


def test_broken_yaml_file(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("train:\n  steps: 3\n rollout: [\n")
    code, err, _ = run_cli(capsys, "--config", str(path))
    assert code == 2 and f"config file {path} is not valid YAML at line" in err and "Traceback" not in err


def test_bad_model_and_data_fail_before_workers(tmp_path, capsys, model_dir):
    data = write_parquet(tmp_path / "train.parquet", verl_rows())
    common = ["--preset", "cpu-demo", "--nproc", "2", f"run.output_dir={tmp_path / 'runs'}", f"data.path={data}",
              "data.reward=grpo_rewards:compute_score"]
    no_tokenizer = tmp_path / "no-tok"
    no_tokenizer.mkdir()
    shutil.copy(model_dir / "config.json", no_tokenizer / "config.json")
    code, err, _ = run_cli(capsys, *common, f"model.path={no_tokenizer}")
    assert code == 2 and "has no tokenizer" in err
    unknown = tmp_path / "unknown-arch"
    shutil.copytree(model_dir, unknown)
    config = json.loads((unknown / "config.json").read_text())
    config["model_type"] = "quantum-llm"
    (unknown / "config.json").write_text(json.dumps(config))
    code, err, _ = run_cli(capsys, *common, f"model.path={unknown}")
    assert code == 2 and "unknown architecture (model_type 'quantum-llm')" in err
    code, err, _ = run_cli(capsys, *common, f"model.path={model_dir}", "data.max_prompt_tokens=3")
    assert code == 2 and "data.max_prompt_tokens=3 drops every prompt" in err
    code, err, _ = run_cli(capsys, *common, f"model.path={model_dir}", "data.prompt_key=query")
    assert code == 2 and "no prompt column query" in err
    code, err, _ = run_cli(capsys, *common, f"model.path={model_dir}", "data.reward=grpo_rewards:wrong_signature")
    assert code == 2 and "fits no reward style" in err
    code, err, _ = run_cli(capsys, *common[:-1], f"model.path={model_dir}")
    assert code == 2 and "data.path needs a reward" in err
    assert not (tmp_path / "runs").exists(), "nothing is written for a run that cannot start"


def test_long_prompts_are_dropped_and_counted(tmp_path, tokenizer, capsys):
    from engine.rl.prompts import drop_long_prompts

    rows = verl_rows() + verl_rows([("What is " + "very " * 80 + "big?", "1")])
    samples = load_samples(str(write_parquet(tmp_path / "t.parquet", rows)), PromptFormatter(tokenizer))
    kept = drop_long_prompts(samples, tokenizer, 100, "t.parquet")
    assert len(kept) == len(QUESTIONS)
    assert "dropped 1 of 13 prompts longer than data.max_prompt_tokens=100" in capsys.readouterr().out


def test_validation_split_dataset_dict_and_missing_tensorboard(tmp_path, tokenizer, monkeypatch):
    from engine.rl.algorithms.grpo.config import GRPOConfig
    from engine.rl.prompts import build_tasks, data_spec
    from engine.train.loggers import require_tensorboard

    root = tmp_path / "dd"
    write_datasets_dir(root / "train", verl_rows())
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    config = GRPOConfig()
    config.data.path, config.data.val_fraction, config.data.task = str(root), 0.25, "gsm8k"
    task, validation = build_tasks(data_spec(config), tokenizer)
    assert len(task.samples) == 9 and len(validation) == 3
    assert not {s.where for s in task.samples} & {s.where for s in validation}
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
    with pytest.raises(ValueError, match="DatasetDict without a train split"):
        build_tasks(data_spec(config), tokenizer)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an environment without it looks like
    with pytest.raises(ValueError, match=r"tensorboard, which is not installed: pip install 'accel-backends\[tens"):
        require_tensorboard()


def test_the_config_enters_data_loading_once_and_answers_are_needed_only_for_non_trl_rewards(tmp_path, tokenizer):
    from engine.rl.algorithms.grpo.config import GRPOConfig
    from engine.rl.prompts import build_tasks, data_spec, needs_answers, validation_set

    path = write_jsonl(tmp_path / "q.jsonl", [{"prompt": f"What is {n} + 1?"} for n in range(6)])  # no answers
    config = GRPOConfig()
    config.data.path, config.data.val_fraction = str(path), 0.5
    config.data.reward, config.data.reward_weights = ["grpo_rewards:length_penalty"], [0.5]
    spec = data_spec(config)
    config.data.path = "elsewhere.jsonl"  # the spec holds what was resolved; nothing reads the config again
    assert spec.rewards == (("grpo_rewards:length_penalty", 0.5),) and spec.path == str(path)
    rewards = load_rewards(list(spec.rewards), spec.reward_style)
    assert not needs_answers(rewards)  # TRL style: no answer column needed
    task, validation = build_tasks(spec, tokenizer, needs_answers(rewards))
    assert len(task.samples) == len(validation) == 3
    assert validation_set(spec, tokenizer, need_answer=False) == validation  # accel-grpo eval's held-out rows
    simple = load_rewards(parse_specs("grpo_rewards:short_reply", None))
    with pytest.raises(ValueError, match="no answer column"):
        build_tasks(spec, tokenizer, needs_answers(simple))
