"""The presets do what a user expects (issue 28's three bugs, each reproduced as a new user met it): with no
--preset, a user's own model or data gets the library defaults, not the CPU demo's; the demo applies when neither is
given or when named; --print-config says which preset applied and why; eval of a model directory sizes the prompt
limit (and so vLLM's context) from the validation data it reads."""

import json

import pytest
from grpo_data import fixture_model, write_jsonl

from engine.offline.objectives.sft.cli import main as sft_main
from engine.rl.algorithms.grpo.cli import main as grpo_main

WORDS = "apples books pencils dollars minutes hours friends cookies marbles trees garden school".split()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return fixture_model(tmp_path_factory.mktemp("fixture") / "tiny-qwen")


def _printed(capsys, main, *args):
    code = main(["--print-config", "--nproc", "1", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out), captured.err


def test_sft_on_a_users_chat_data_keeps_the_assistant_turn_after_token_64(model_dir, tmp_path, capsys):
    """Bug: `accel-sft model.path=M data.path=chat.jsonl` applied the demo's data.max_length=64, so a chat whose
    first assistant turn starts after token 64 failed with "no token gets the loss"."""
    system = "You are a careful assistant. " + " ".join(WORDS * 4)  # well over 64 tokens before the answer
    rows = [{"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"count to {i}"},
                          {"role": "assistant", "content": " ".join(str(k) for k in range(i))}]} for i in range(1, 9)]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    printed, err = _printed(capsys, sft_main, f"model.path={model_dir}", f"data.path={data}")
    assert printed["preset"] == "default" and printed["data"]["max_length"] == 1024
    assert printed["derived"]["train_examples"] == 8  # every example kept, each with its assistant tokens
    assert "accel-sft: preset default (the library defaults: data.path and model.path given and no --preset" in err
    code = sft_main(["--print-config", "--nproc", "1", "--preset", "cpu-demo", f"model.path={model_dir}",
                     f"data.path={data}"])  # the demo's settings, when named, still cut at 64 tokens
    assert code == 2 and "no token gets the loss after data.max_length cut it" in capsys.readouterr().err


def test_grpo_on_a_users_model_and_data_samples_real_responses(model_dir, tmp_path, capsys):
    """Bug: `accel-grpo model.path=M data.path=train.parquet` sampled 4 tokens per response (the demo's)."""
    data = write_jsonl(tmp_path / "train.jsonl", [{"question": f"what is {a} + 1", "answer": f"#### {a + 1}"}
                                                  for a in range(8)])
    printed, err = _printed(capsys, grpo_main, f"model.path={model_dir}", f"data.path={data}")
    assert printed["preset"] == "default" and printed["trainer"] == "grpo"
    assert printed["rollout"]["max_new_tokens"] == 512 and printed["data"]["task"] == "gsm8k"
    assert printed["run"]["save_on_interrupt"] is True and printed["run"]["save_every"] == 0
    assert "accel-grpo: preset default (the library defaults:" in err
    demo, err = _printed(capsys, grpo_main)  # nothing given: the demo
    assert demo["preset"] == "cpu-demo" and demo["rollout"]["max_new_tokens"] == 4 and demo["data"]["task"] == "echo"
    assert "accel-grpo: preset cpu-demo (the demo: no --preset, no model.path and no data.path given)" in err


def test_the_library_defaults_need_a_model_and_say_how_to_get_the_demo(tmp_path, capsys):
    data = write_jsonl(tmp_path / "train.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    assert grpo_main(["--print-config", f"data.path={data}"]) == 2
    err = capsys.readouterr().err
    assert "model.path=/local/path/to/hf-model is needed with your own data" in err and "CPU demo" in err


def test_grpo_eval_of_a_model_directory_sizes_the_prompt_limit_from_its_validation_data(model_dir, tmp_path):
    """Bug: `accel-grpo eval MODEL_DIR rollout.engine=vllm data.val_path=val.parquet` sized vLLM's context from the
    demo's echo prompts (37 tokens) and died on a 62-token validation prompt."""
    from transformers import AutoTokenizer

    from engine.rl.algorithms.grpo.config import max_sequence_tokens
    from engine.train.eval_config import eval_config
    from engine.train.registry import get_recipe

    question = "Tom has " + " and ".join(f"{k} {WORDS[k % len(WORDS)]}" for k in range(20)) + ": how many?"
    val = write_jsonl(tmp_path / "val.jsonl", [{"question": question, "answer": "#### 20"},
                                               {"question": "1 + 1?", "answer": "#### 2"}])
    recipe = get_recipe("grpo")
    config, target, _ = eval_config(recipe, str(model_dir), overrides=[f"data.val_path={val}"])
    assert target == {"model": str(model_dir)} and config.preset == "default" and config.data.task == "gsm8k"
    assert recipe.eval_inputs(config)["prompts"] == 2
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    longest = max(len(tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                    add_generation_prompt=True)) for q in (question,))
    assert config.data.max_prompt_tokens >= 60  # the long prompt, in tokens, chat template applied
    assert config.data.max_prompt_tokens <= longest  # tokens, not characters
    assert max_sequence_tokens(config) == config.data.max_prompt_tokens + config.rollout.max_new_tokens
