"""engine/rollout/multi_turn/tools.py and execution.py: loading tools and environments (and naming what is wrong with
them), running calls concurrently within a timeout, errors as results, truncation."""

import json

import agent_tools
import pytest

from engine.rollout.multi_turn.execution import call_tool, run_calls
from engine.rollout.multi_turn.parsing import ToolCall
from engine.rollout.multi_turn.tools import ToolError, bound_tools, class_schemas, load_environment, load_tools


def test_tools_load_with_their_schemas():
    tools = load_tools(["agent_tools:calculator", "agent_tools:lookup"])
    assert sorted(tools) == ["calculator", "lookup"]
    assert tools["calculator"]("3 + 4") == "7"


@pytest.mark.parametrize("spec, message", [
    ("agent_tools", "must look like 'package.module:function'"),
    ("no_such_module:f", "cannot import module 'no_such_module'"),
    ("agent_tools:missing", "has no function 'missing'"),
    ("agent_tools:NOT_A_FUNCTION", "is not a function"),
    ("agent_tools:undocumented", "has no docstring"),
    ("agent_tools:untyped", "cannot be described to the model"),
])
def test_a_bad_tool_is_named(spec, message):
    with pytest.raises(ToolError, match=message) as caught:
        load_tools([spec])
    assert "rollout.tools" in str(caught.value) and "\n" not in str(caught.value)


def test_an_environment_written_for_trl_exposes_its_public_methods():
    cls = load_environment("agent_tools:CounterEnv")
    assert [s["function"]["name"] for s in class_schemas(cls)] == ["add"]
    assert [s["function"]["name"] for s in class_schemas(load_environment("agent_tools:RewardingEnv"))] == ["add"]
    env = cls()
    assert env.reset(answer="5") == " Reach 5."
    tools = bound_tools(env)
    assert sorted(tools) == ["add"] and tools["add"](amount=2) == "total is 2" and env.total == 2


@pytest.mark.parametrize("spec, message", [
    ("agent_tools:NoResetEnv", "has no reset() method"),
    ("agent_tools:UndocumentedEnv", "has no docstring"),
    ("agent_tools:calculator", "is not a class"),
    ("agent_tools:ConfiguredEnv", "cannot be built with no arguments (its __init__ needs target)"),
    ("agent_tools:DeafEnv", "reset() takes no keyword arguments"),
])
def test_a_bad_environment_is_named(spec, message):
    with pytest.raises(ToolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_environment(spec)


TOOLS = {"calculator": agent_tools.calculator, "lookup": agent_tools.lookup, "broken": agent_tools.broken,
         "sleepy": agent_tools.sleepy, "verbose": agent_tools.verbose}


def test_failures_become_error_results():
    unknown = call_tool(TOOLS, ToolCall("search", {}), 5)
    assert unknown.failed and "unknown tool 'search'" in json.loads(unknown.content)["error"]
    raised = call_tool(TOOLS, ToolCall("broken", {"x": 3}), 5)
    assert raised.failed and json.loads(raised.content) == {"error": "RuntimeError: broken tool got 3"}
    exited = call_tool({"quitter": agent_tools.quitter}, ToolCall("quitter", {"code": 3}), 5)
    assert exited.failed and json.loads(exited.content) == {"error": "SystemExit: 3"}
    wrong = call_tool(TOOLS, ToolCall("calculator", {"formula": "1 + 1"}), 5)
    assert wrong.failed and "TypeError" in json.loads(wrong.content)["error"]
    late = call_tool(TOOLS, ToolCall("sleepy", {"seconds": 3}), 0.05)
    assert late.failed and "rollout.tool_timeout_s=0.05" in json.loads(late.content)["error"]
    fine = call_tool(TOOLS, ToolCall("lookup", {"key": "abc"}), 5)
    assert not fine.failed and json.loads(fine.content) == {"key": "abc", "value": 3}


@pytest.mark.parametrize("parallel", [1, 3])
def test_calls_of_a_round_run_concurrently_up_to_the_limit(parallel):
    agent_tools.CONCURRENT.update(now=0, most=0)
    jobs = [(TOOLS, ToolCall("sleepy", {"seconds": 0.3})) for _ in range(3)]
    results = run_calls(jobs, timeout_s=10, parallel=parallel)
    assert [r.content for r in results] == ["slept"] * 3
    assert agent_tools.CONCURRENT["most"] == parallel


def test_results_are_cut_to_the_token_limit():
    from engine.demo_model import build_tokenizer

    tokenizer = build_tokenizer()
    (long,) = run_calls([(TOOLS, ToolCall("verbose", {"words": 100}))], timeout_s=5, parallel=1,
                        tokenizer=tokenizer, max_tokens=10)
    assert len(tokenizer(long.content, add_special_tokens=False)["input_ids"]) <= 10
    assert long.content and " ".join(["apples"] * 100).startswith(long.content)
    (short,) = run_calls([(TOOLS, ToolCall("calculator", {"expression": "2 * 3"}))], timeout_s=5, parallel=1,
                         tokenizer=tokenizer, max_tokens=10)
    assert short.content == "6"
