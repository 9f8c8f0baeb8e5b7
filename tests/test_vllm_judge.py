"""An LLM judge for real (the vLLM leg, ci/test-vllm.sh): vLLM's CPU build serving a tiny model built from a config
(no download) as ``reward_model.judge_url``, and as ``reward_model.judge_model``, the judge server a run starts
before its first step and stops at its end.

The tiny model answers no number of its own: vLLM's structured outputs (``reward_model.judge_answer_regex``) make
every reply a score, which is parsed; a call the server refuses (an unknown model name, a prompt past the judge's
context) is a counted failure with reward 0. ``accel-ppo`` with the colocated vLLM engine and ``judge_model`` runs
two steps scored by the judge only, and its judge server is gone after the run. The judge server (issue 45)
listens on loopback only, wants its key and runs without vLLM's development routes. Skipped where vLLM is missing.
"""

import json
import os
import re

import pytest
from conftest import REPO, run_python

# The leg's marks and skip, the vLLM environment and the model size: as the colocated engine's tests.
from test_vllm_engine_ranks import ENV, HIDDEN, pytestmark  # noqa: F401 - pytestmark: pytest reads it here
from test_vllm_server_ranks import _processes_with

JUDGE_CONTEXT = 512  # tokens: a longer judge prompt is refused by the server


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from engine.demo_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("judge-model"), hidden_size=HIDDEN, layers=2, eos_bias=0.0)


@pytest.fixture(scope="module")
def judge(model_dir):
    """The judge server as a run starts it (engine/rl/judge_server.py), shared by the module; its /v1 URL and
    manager (which holds its key)."""
    import accel_backends
    from engine.rl.judge_server import start_judge_server
    from engine.rl.reward_model import RewardModelConfig

    section = RewardModelConfig(judge_model=str(model_dir), judge_kv_cache_gib=1.0,
                                judge_max_model_len=JUDGE_CONTEXT)
    url, manager = start_judge_server(section, accel_backends.get_backend("cpu").inference_engine_facts())
    yield url, manager
    manager.stop()


def test_a_vllm_judge_url_scores_are_parsed_and_refused_calls_counted(judge, model_dir):
    """...and (issue 45) the judge listens on loopback only, refuses a call without its key, and runs without
    vLLM's development routes."""
    from listeners import exposed, listening, process_group

    from engine.rl.judge import JudgeReward
    from engine.rl.prompt_types import Sample
    from engine.rl.reward_model import RewardModelConfig
    from engine.rollout.vllm_server.client import ServerClient, ServerError

    judge, manager = judge
    pids = process_group(manager.processes[0].pid)
    assert ("127.0.0.1", manager.specs[0].port) in listening(pids) and exposed(pids) == [], listening(pids)
    keyed = ServerClient(manager.specs[0].url, api_key=manager.api_key)
    assert keyed.healthy() and not ServerClient(manager.specs[0].url, api_key="").healthy()
    with pytest.raises(ServerError, match="answered 404"):  # no development routes
        keyed.call("GET", "/server_info")
    with pytest.raises(ServerError, match="answered 401"):  # a judge call without the key
        ServerClient(manager.specs[0].url, api_key="").call("POST", "/v1/chat/completions", {"messages": []})

    samples = [Sample(prompt="a x2:", raw_prompt="a x2:", answer="aa")] * 4
    responses = ["aa", "b", "zq " * 800, "aaa"]  # the third: a judge prompt past the server's context
    section = RewardModelConfig(judge_url=judge, judge_constrained=True, retries=1, timeout_s=120.0)
    judged = JudgeReward(section, api_key=manager.api_key)
    scores = judged.score(samples, responses, None)
    stats = judged.take_stats()
    assert scores[2] == 0.0 and stats["reward_model_failures"] == 1.0, (scores, stats)
    assert stats["reward_model_scored"] == 3.0 and stats["reward_model_score_sum"] == sum(scores)
    for score in (scores[0], scores[1], scores[3]):  # each reply had the regex's form, parsed as it was
        assert re.fullmatch(section.judge_answer_regex, f"{score:g}"), scores
    assert judged.model_name() == str(model_dir)  # from the server's /models
    again = JudgeReward(section, api_key=manager.api_key).score(samples[:1], ["aa"], None)
    assert again == scores[:1]  # temperature 0: the same score
    # An unknown model name is refused at every attempt: each response a counted failure, none fatal.
    unknown = JudgeReward(RewardModelConfig(judge_url=judge, judge_name="no-such-judge", retries=1),
                          api_key=manager.api_key)
    assert unknown.score(samples, responses, None) == [0.0] * 4
    assert unknown.take_stats()["reward_model_failures"] == 4.0


def test_ppo_with_colocated_vllm_and_a_judge_model_it_starts_and_stops(tmp_path, model_dir):
    """accel-ppo (issue 37 item 4: every rollout engine) with rollout.engine=vllm colocated, scored by a judge server
    the run starts on a known port; after the run, no process of it is left."""
    from accel_backends.spawn import free_port
    from engine.rollout.vllm_server.client import ServerClient, ServerError

    port = free_port()
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "ACCEL_BACKEND": "cpu",
           "OMP_NUM_THREADS": "1", **ENV}
    result = run_python(["-m", "engine.rl.algorithms.ppo.cli", "--preset", "cpu-demo", "--nproc", "1",
                         f"model.path={model_dir}", "train.steps=2", "train.prompts_per_step=4",
                         "train.micro_batch_size=8", "rollout.engine=vllm", "rollout.vllm.kv_cache_gib=1",
                         "run.progress=false", "run.save_every=0", f"reward_model.judge_model={model_dir}",
                         f"reward_model.judge_port={port}", "reward_model.judge_kv_cache_gib=1",
                         f"reward_model.judge_max_model_len={JUDGE_CONTEXT}", f"run.output_dir={tmp_path}",
                         "run.name=judged"], env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "judged" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["reward_model/failures"] == 0 and 0 <= row["reward_model/score_mean"] <= 99.9, row
        assert row["reward/reward_model"] == pytest.approx(row["reward_mean"])  # the judge is the only reward
        assert row["reward_model/s"] > 0 and row["critic/vf_loss"] >= 0, row
    with pytest.raises(ServerError, match="is unreachable"):  # gone, not merely refusing a call without its key
        ServerClient(f"http://127.0.0.1:{port}").call("GET", "/health")
    assert _processes_with(f"--port {port}") == []  # the server and its guard ended with the run
    print({"step_time_s": [round(row["step_time_s"], 2) for row in rows],
           "reward_model/s": [round(row["reward_model/s"], 3) for row in rows]})
