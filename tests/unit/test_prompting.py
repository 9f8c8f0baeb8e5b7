"""engine/train/prompting.py: an exported model remembers how its run prompted it, where each reader looks.
transformers (the chat template's default system prompt, generation_config.json's max_new_tokens), and a run or an
eval started from the directory (the options the file and the overrides leave out, with a notice); a run's own
evaluation keeps its record. Bug (issue 39): `eval EXPORTED_DIR` and GRPO after SFT fell back to the template's
default system prompt and 512 new tokens."""

import pytest


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A model directory as an export of a run with a system prompt and 12 new tokens writes it."""
    from engine.demo_model import make_tiny_model
    from engine.train import prompting

    directory = make_tiny_model(tmp_path_factory.mktemp("prompting") / "model", vocab_size=512)
    settings = {"system_prompt": "Answer with a number.", "chat_template": "auto", "max_new_tokens": 12}
    prompting.write(directory, settings)
    prompting.write(directory, settings)  # exported again from a run started from it: one default, not two
    return directory


def test_transformers_honours_what_the_export_remembers(exported):
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(exported)
    alone = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False)
    assert alone.count("Answer with a number.") == 1 and alone.index("Answer with a number.") < alone.index("2+2?")
    own = tokenizer.apply_chat_template([{"role": "system", "content": "Be kind."}, {"role": "user", "content": "x"}],
                                        tokenize=False)
    assert "Be kind." in own and "Answer with a number." not in own  # a conversation's own system message wins
    assert GenerationConfig.from_pretrained(exported).max_new_tokens == 12


def test_a_run_and_an_eval_from_the_directory_use_them_unless_told_otherwise(exported, tmp_path):
    from engine.train.cli import load
    from engine.train.eval_config import eval_config
    from engine.train.registry import get_recipe

    recipe = get_recipe("grpo")
    config, notices, _ = load(recipe, None, None, [f"model.path={exported}"])
    assert (config.data.system_prompt, config.rollout.max_new_tokens) == ("Answer with a number.", 12)
    assert notices == [f"model.path {exported} remembers how it was trained to be prompted (accel_prompting.json): "
                       'using data.system_prompt="Answer with a number.", rollout.max_new_tokens=12 (set an option '
                       "to change it)"]
    config, notices, _ = load(recipe, None, None, [f"model.path={exported}", "rollout.max_new_tokens=3"])
    assert (config.data.system_prompt, config.rollout.max_new_tokens) == ("Answer with a number.", 3)
    config, _, _ = eval_config(recipe, exported, overrides=["data.val_path=v.jsonl"])
    assert (config.data.system_prompt, config.rollout.max_new_tokens) == ("Answer with a number.", 12)
    # A run's own record is the truth: it does not take a model directory's settings.
    run = recipe.schema(preset="default")
    run.model.path = str(exported)
    config, notices, _ = load(recipe, None, None, [], base=run, remember=False)
    assert (config.data.system_prompt, config.rollout.max_new_tokens, notices) == (None, 512, [])


def test_path_options_are_the_users_own_directory(tmp_path, monkeypatch):
    """Bug: a relative model.path reached a vLLM server started elsewhere, which looked it up on the Hub."""
    from engine.train.cli import load
    from engine.train.registry import get_recipe

    monkeypatch.chdir(tmp_path)
    config, _, _ = load(get_recipe("grpo"), None, None, ["model.path=tiny128", "data.path=data/train.jsonl"])
    assert (config.model.path, config.data.path) == (str(tmp_path / "tiny128"), str(tmp_path / "data/train.jsonl"))
    assert config.to_dict()["model"]["path"] == str(tmp_path / "tiny128")  # what the workers and servers get
    config, _, _ = load(get_recipe("grpo"), "cpu-demo", None, [])
    assert config.model.path == "builtin:tiny-char" and config.data.path is None
    config, _, _ = load(get_recipe("sft"), None, None, ["model.path=../m", "data.val_path=v.jsonl"])
    assert (config.model.path, config.data.val_path) == (str(tmp_path.parent / "m"), str(tmp_path / "v.jsonl"))


def test_a_reward_module_in_the_working_directory_imports_without_pythonpath(tmp_path, monkeypatch):
    """Bug: `accel-grpo data.reward=my_rewards:score` (a console script: the working directory is not on sys.path)
    needed PYTHONPATH=. in every first own-data run."""
    import sys

    from engine.object_loader import load_object

    (tmp_path / "my_rewards_in_cwd.py").write_text("def score(prompt, response, answer):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    found = load_object("my_rewards_in_cwd:score", what="function", key="data.reward", accept=callable)
    assert found("p", "r", "a") == 1.0 and str(tmp_path) not in sys.path  # found by name only (issue 45)
