"""docs/agents.md runs as written: its files are saved, its commands run in order (the CPU, 2 processes), and the
training command, with the scripted engine that makes the calculator calls a tool-using model would
(``rollout.engine=test-script``, the one override the page names), trains 2 steps end to end: tool calls in the
metrics and in samples.jsonl, rewards from the trajectories' messages."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

DOC = (REPO / "docs" / "agents.md").read_text()


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S)


def _commands(block):
    """Each command of a bash block (continuation lines joined, comments dropped) as (env, argv)."""
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words:
            yield env, words


def test_the_calculator_example_trains_end_to_end(tmp_path):
    for source in _blocks("python"):
        name = source.splitlines()[0].split()[1].rstrip(":")  # "# calculator_task.py: ..."
        if name.endswith(".py"):
            (tmp_path / name).write_text(source)
    assert (tmp_path / "calculator_task.py").is_file() and (tmp_path / "make_arithmetic.py").is_file()
    (setup,) = [b for b in _blocks("bash") if "make-tiny-model tiny-qwen" in b]
    (train,) = [b for b in _blocks("bash") if "model.path=tiny-qwen" in b]
    base_env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCEL_BACKEND": "cpu",
                "ACCEL_BACKENDS_PLUGINS": "agent_script_plugin"}
    for env, argv in [*_commands(setup), *_commands(train)]:
        if argv[0] == "accel-grpo":
            argv = [sys.executable, "-m", "engine.rl.algorithms.grpo.cli", *argv[1:]]
            if "model.path=tiny-qwen" in argv:
                argv.append("rollout.engine=test-script")  # the tiny random model never calls a tool itself
        elif argv[0] == "python":
            argv = [sys.executable, *argv[1:]]
        paths = [env.get("PYTHONPATH", "."), str(REPO / "tests"), str(REPO)]
        run_env = {**base_env, **env, "PYTHONPATH": os.pathsep.join(paths)}
        done = subprocess.run(argv, cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    run = tmp_path / "runs" / "calculator"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]  # step 0: the baseline validation, through the loop too
    assert "val/accuracy" in metrics[0] and "val/accuracy" in metrics[2]
    metrics = metrics[1:]
    for m in metrics:
        assert m["tools/call_frequency"] > 0 and m["rollout/turns_mean"] > 1 and m["rollout/tool_tokens"] > 0
        assert 0 <= m["tools/failure_frequency"] < 1 and 0 < m["reward_mean"] < 1
        assert m["response_length"] < 160  # the model's own tokens only
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    roles = [[message["role"] for message in s["turns"]] for s in samples]
    assert ["assistant", "tool", "assistant"] in roles
    called = next(s for s in samples if [m["role"] for m in s["turns"]] == ["assistant", "tool", "assistant"])
    assert called["turns"][0]["tool_calls"][0]["function"]["name"] == "calculator"
    assert called["turns"][1]["content"] in called["turns"][2]["content"]  # the scripted answer quotes the result
    assert (run / "checkpoints" / "step_000002").is_dir()
