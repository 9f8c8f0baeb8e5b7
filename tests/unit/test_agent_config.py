"""The agent keys' bad input: one sentence each from the config check, before any worker starts (the CLI prints
one line and exits 2), naming the value and what to do."""

import shutil

import pytest

from engine.demo_model import make_tiny_model
from engine.rl.algorithms.grpo.config import build_config, check
from engine.rollout.engines.hf_continuous import ContinuousRolloutEngine

PLAIN_CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("agent-model") / "model")


def problems(*overrides):
    return check(build_config(None, None, list(overrides)), 1)


def test_a_good_agent_config_passes(model_dir):
    assert problems(f"model.path={model_dir}", "rollout.tools=[agent_tools:calculator]") == []
    assert problems(f"model.path={model_dir}", "rollout.environment=agent_tools:RewardingEnv") == []


@pytest.mark.parametrize("override, message", [
    ("rollout.tools=[nope:calculator]", "rollout.tools 'nope:calculator': cannot import module 'nope'"),
    ("rollout.tools=[agent_tools:undocumented]", "tool 'undocumented' has no docstring"),
    ("rollout.tools=[agent_tools:untyped]", "tool 'untyped' cannot be described to the model"),
    ("rollout.environment=agent_tools:NoResetEnv", "has no reset() method"),
    ("rollout.environment=agent_tools:CounterEnv", "has no get_reward() and data.reward is not set"),
    ("rollout.max_parallel_tool_calls=0", "rollout.max_parallel_tool_calls must be a positive integer"),
])
def test_bad_tools_and_environments_are_named(model_dir, override, message):
    tools = [] if override.startswith("rollout.tools") else ["rollout.tools=[agent_tools:calculator]"]
    found = problems(f"model.path={model_dir}", *tools, override)
    assert len(found) == 1 and message in found[0], found


def test_a_model_whose_template_cannot_take_tools_is_refused(model_dir, tmp_path):
    (found,) = problems("rollout.tools=[agent_tools:calculator]")  # the built-in character model
    assert "the tokenizer of model.path builtin:tiny-char has none" in found
    plain = shutil.copytree(model_dir, tmp_path / "plain")
    (plain / "chat_template.jinja").write_text(PLAIN_CHATML)
    (found,) = problems(f"model.path={plain}", "rollout.tools=[agent_tools:calculator]")
    assert "ignores the tools= argument" in found
    template = (model_dir / "chat_template.jinja").read_text()
    rewriting = shutil.copytree(model_dir, tmp_path / "rewriting")
    (rewriting / "chat_template.jinja").write_text(template.replace(
        "{{ message['content'] or '' }}",
        "{% if message['role'] == 'assistant' and not loop.last %}(earlier) {% endif %}{{ message['content'] or '' }}"))
    (found,) = problems(f"model.path={rewriting}", "rollout.tools=[agent_tools:calculator]")
    assert "is not prefix-preserving for tool messages" in found
    (found,) = problems(f"model.path={model_dir}", "rollout.tools=[agent_tools:calculator]", "data.chat_template=none")
    assert "remove data.chat_template=none" in found


def test_an_engine_that_cannot_continue_token_ids_is_refused(model_dir, monkeypatch):
    monkeypatch.setattr(ContinuousRolloutEngine, "multi_turn", False, raising=False)
    (found,) = problems(f"model.path={model_dir}", "rollout.tools=[agent_tools:calculator]")
    assert "rollout.engine 'hf-continuous' cannot continue a trajectory from token ids" in found


def test_the_cli_stops_with_one_line_before_any_worker(model_dir, capsys, tmp_path):
    from engine.rl.algorithms.grpo.cli import main

    assert main(["--preset", "cpu-demo", f"model.path={model_dir}", "rollout.tools=[agent_tools:untyped]",
                 f"run.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("accel-grpo: error: invalid configuration: rollout.tools")
    assert list(tmp_path.iterdir()) == []


def test_the_token_budget_must_hold_the_tool_schemas(model_dir):
    fits = ["data.max_prompt_tokens=40", "rollout.max_new_tokens=60"]
    assert problems(f"model.path={model_dir}", *fits, "train.micro_batch_tokens=100") == []
    (found,) = problems(f"model.path={model_dir}", *fits, "train.micro_batch_tokens=100",
                        "rollout.tools=[agent_tools:calculator]")
    assert "train.micro_batch_tokens=100 is smaller than the longest possible sequence with tools" in found
    assert "tokens of tool schemas" in found
