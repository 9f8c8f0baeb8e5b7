"""A model key given as a Hugging Face Hub name (issue 45): one line before any worker when the local cache lacks
it, naming the key, what was looked up where and what to do; a name the cache holds is checked as its directory."""

from types import SimpleNamespace

import pytest

from engine.train.model_dir import check_model_dir

NAME = "accel-test-org/not-downloaded-model"


@pytest.fixture()
def empty_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def _said(lines, key, cache):
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith(f"{key} {NAME} is neither a local directory nor a Hugging Face Hub model"), lines
    assert f"{NAME}/config.json in {cache}" in lines[0] and f"hf download {NAME}" in lines[0], lines


def test_every_model_key_names_a_hub_name_missing_from_the_cache(empty_cache):
    from engine.recipes.ppo.critic_checks import path_problems
    from engine.rl.reward_model import RewardModelConfig, problems
    from engine.rl.teacher import source_problems

    _said(check_model_dir(NAME), "model.path", empty_cache)
    _said(source_problems(SimpleNamespace(path=NAME, server_url=None)), "teacher.path", empty_cache)
    _said(problems(SimpleNamespace(reward_model=RewardModelConfig(path=NAME))), "reward_model.path", empty_cache)
    _said(path_problems(NAME), "critic.path", empty_cache)


def test_a_hub_name_in_the_cache_is_checked_as_its_snapshot(empty_cache):
    snapshot = empty_cache / f"models--{NAME.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "llama"}')
    (empty_cache / f"models--{NAME.replace('/', '--')}" / "refs").mkdir()
    (empty_cache / f"models--{NAME.replace('/', '--')}" / "refs" / "main").write_text("0" * 40)
    lines = check_model_dir(NAME)  # found: the directory's own checks run (this one has no tokenizer)
    assert lines == [f"model.path {NAME} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json): copy "
                     "the tokenizer files of the model into it"], lines


def test_a_missing_file_system_path_is_not_called_a_hub_name(tmp_path):
    lines = check_model_dir(str(tmp_path / "missing"))
    assert lines == [f"model.path {tmp_path / 'missing'} is not a Hugging Face model directory (no config.json)"]
