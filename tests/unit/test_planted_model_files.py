"""A planted ``pytorch_model.bin`` (a pickle that would run ``touch MARKER``) in a model directory the user names
(``model.path``/``teacher.path`` through ``check_model_dir``, ``reward_model.path``, ``critic.path``) is refused by
the launcher's checks in one line naming the file; nothing runs. Real pickled weights pass."""

from types import SimpleNamespace

import pytest
import torch
from planted_pickles import plant_weights


@pytest.fixture
def planted(tmp_path):
    """``(model directory, marker)``: a causal LM's config, a tokenizer file and a planted pytorch_model.bin."""
    from transformers import Qwen2Config

    directory = tmp_path / "model"
    Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1).save_pretrained(directory)
    (directory / "tokenizer.json").write_text("{}")
    marker = tmp_path / "marker"
    plant_weights(directory, marker)
    return directory, marker


def _one_refusal(lines: list[str], directory, prefix: str = "") -> None:
    refused = [line for line in lines if "was refused" in line]
    assert len(refused) == 1 and "\n" not in refused[0], lines
    assert refused[0].startswith(f"{prefix}{directory / 'pytorch_model.bin'} was refused: it asks to load "), refused
    assert "nothing in it was run" in refused[0] and "safetensors" in refused[0], refused


def test_real_pickled_weights_pass(tmp_path):
    from engine.checkpoint.model_files import pickled_weights_problems

    torch.save({"lm_head.weight": torch.ones(3, 2)}, tmp_path / "pytorch_model.bin")
    assert pickled_weights_problems(tmp_path, "reward_model.path") == []
    assert pickled_weights_problems(tmp_path / "missing", "reward_model.path") == []  # a hub name: left to the hub


def test_model_and_teacher_paths(planted):
    from engine.rl.algorithms.distill.teacher import source_problems
    from engine.train.model_dir import check_model_dir

    directory, marker = planted
    _one_refusal(check_model_dir(str(directory)), directory)
    teacher = SimpleNamespace(path=str(directory), server_url=None)
    _one_refusal(source_problems(teacher), directory, "teacher.path: ")
    assert not marker.exists()


def test_reward_model_path(planted):
    from engine.rl.reward_model import RewardModelConfig, problems

    directory, marker = planted
    _one_refusal(problems(SimpleNamespace(reward_model=RewardModelConfig(path=str(directory)))), directory,
                 "reward_model.path: ")
    assert not marker.exists()


def test_critic_path(planted):
    from engine.rl.algorithms.ppo.checks import algorithm_problems
    from engine.rl.algorithms.ppo.schema import PPOConfig

    directory, marker = planted
    config = PPOConfig()
    config.critic.path = str(directory)
    _one_refusal(algorithm_problems(config), directory, "critic.path: ")
    assert not marker.exists()
