"""engine/rl/reward_model.py and judge.py: model-served rewards (a sequence-classification model, an HTTP judge)
as rewards of an RL run, their figures, the weights and the config checks. The judge is a local HTTP stand-in
that answers scores, garbage, errors or nothing in time."""

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from reward_models import make_reward_model

import accel_backends
from engine.rl import reward_model, scoring
from engine.rl.algorithms.grpo.config import GRPOConfig, check
from engine.rl.judge import JudgeReward, parse_score
from engine.rl.prompt_types import Sample
from engine.rl.prompts import data_spec, echo_reward
from engine.rl.reward_model import RewardModelConfig, model_rewards
from engine.rl.rewards import score_all
from engine.rl.scorers import ClassifierReward
from engine.rollout import RolloutBatch


class Judge(BaseHTTPRequestHandler):
    """Replies by what the response (after 'Response:') says: 'slow' waits past the timeout, 'garbage' answers
    no number, 'error' is an HTTP 500, anything else scores its length."""

    requests: list = []

    def log_message(self, *args):
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply(200, {"data": [{"id": "stand-in-judge"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Judge.requests.append(body)
        response = body["messages"][0]["content"].split("Response: ")[1].split("\n")[0]
        if response == "error":
            return self._reply(500, {"error": "boom"})
        if response == "slow":
            time.sleep(1.5)
        text = "I cannot judge this." if response == "garbage" else f"Score: {len(response)}"
        self._reply(200, {"choices": [{"message": {"role": "assistant", "content": text}}]})


@pytest.fixture(scope="module")
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("reply", "score"), [
    ("7", 7.0), ("Score: 8.5/10", 8.5), ('{"score": 3}', 3.0), ("The answer has 2 steps. Score: 9", 9.0),
    ("no idea", None), ("", None), ("nan", None)])
def test_parse_score(reply, score):
    assert parse_score(reply) == score


def test_a_judge_that_times_out_errs_or_answers_garbage_is_counted_not_fatal(judge_url):
    Judge.requests.clear()
    section = RewardModelConfig(judge_url=judge_url, judge_prompt="Q: {prompt} ({answer})\nResponse: {response}\n",
                                timeout_s=0.5, retries=1, max_parallel=4)
    judge = JudgeReward(section)
    samples = [Sample(prompt="templated", raw_prompt="what?", answer="42")] * 5
    scores = judge.score(samples, ["good", "slow", "garbage", "error", "ok"], None)
    assert scores == [4.0, 0.0, 0.0, 0.0, 2.0]
    stats = judge.take_stats()
    assert stats["reward_model_failures"] == 3.0 and stats["reward_model_scored"] == 2.0
    assert stats["reward_model_score_sum"] == 6.0
    assert judge.take_stats()["reward_model_failures"] == 0.0  # taken: the next step starts from 0
    # Each failed response was asked retries + 1 times; the prompt was filled from the row's own text.
    asked = [r["messages"][0]["content"] for r in Judge.requests]
    assert sum("Response: slow" in text for text in asked) == 2
    assert sum("Response: error" in text for text in asked) == 2
    assert "Q: what? (42)" in asked[0] and Judge.requests[0]["model"] == "stand-in-judge"


def test_an_unreachable_judge_scores_zero_and_counts_every_response():
    judge = JudgeReward(RewardModelConfig(judge_url="http://127.0.0.1:9/v1", timeout_s=0.5, retries=0))
    assert judge.score([Sample(prompt="p")] * 3, ["a", "b", "c"], None) == [0.0, 0.0, 0.0]
    assert judge.take_stats()["reward_model_failures"] == 3.0


def test_classifier_scores_each_response_batched(tmp_path):
    directory = make_reward_model(tmp_path / "rm")
    fn = ClassifierReward(RewardModelConfig(path=str(directory), batch_size=2), accel_backends.get_backend("cpu"))
    responses = ["aaa", "aa", "ab", "bab", "", "bbbb"]
    scores = fn.score([Sample(prompt="b x2:")] * 6, responses, None)
    alone = [fn.score([Sample(prompt="b x2:")], [response], None)[0] for response in responses]
    assert scores == pytest.approx(alone, abs=1e-5)  # batches of 2, left-padded, as one at a time
    assert scores[0] > scores[1] > scores[2] > scores[3] > scores[4] == pytest.approx(scores[5], abs=1e-6) == 0.0
    # What it read: the prompt's tokens, the response's and the EOS, as accel-rm reads a text pair.
    tokenizer = fn.tokenizer
    assert fn.text(Sample(prompt="b x2:"), "ab", None) == [*tokenizer("b x2:ab", add_special_tokens=False)[
        "input_ids"], tokenizer.eos_token_id]


def test_a_reward_model_is_sharded_as_its_size_asks(tmp_path):
    """reward_model.sharding: auto shards across ranks only a model whose weight files exceed replicate_max_gib;
    one process never shards; a bad value is named before any worker."""
    from engine.rl.scorers import shards_across_ranks, weight_bytes

    directory = make_reward_model(tmp_path / "rm")
    size = weight_bytes(str(directory))
    assert size > 0
    section = RewardModelConfig(path=str(directory))
    assert not shards_across_ranks(section, 2)  # auto, a few KiB: under the default 2 GiB
    section.replicate_max_gib = size / 2 ** 30 / 2
    assert shards_across_ranks(section, 2) and not shards_across_ranks(section, 1)
    section.sharding = "replicated"
    assert not shards_across_ranks(section, 2)
    section.sharding, section.replicate_max_gib = "sharded", 100.0
    assert shards_across_ranks(section, 2)
    config = _config(path=str(directory), sharding="split", replicate_max_gib=-1)
    found = " | ".join(reward_model.problems(config))
    assert "reward_model.sharding must be one of auto, replicated, sharded, got 'split'" in found
    assert "reward_model.replicate_max_gib must be a number >= 0, got -1" in found


def _config(**reward_model_keys) -> GRPOConfig:
    config = GRPOConfig()
    config.data.task = "echo"
    for key, value in reward_model_keys.items():
        setattr(config.reward_model, key, value)
    return config


def test_rollout_figures_and_weights_with_rule_rewards(judge_url):
    """The judge's weight is data.reward_weights' last entry; its figures reach the step's metrics."""
    config = _config(judge_url=judge_url, judge_prompt="Response: {response}\n", timeout_s=0.5, retries=0)
    config.data.reward, config.data.reward_weights = "engine.rl.prompts:echo_reward", [2.0, 0.5]
    assert [weight for _, weight in data_spec(config).rewards] == [2.0]
    from engine.rl.rewards import load_rewards

    rewards = load_rewards(list(data_spec(config).rewards)) + model_rewards(config, None)
    assert rewards[-1].weight == 0.5 and rewards[-1].name == "reward_model"
    samples = [Sample(prompt="a x2:", answer="aa")]
    responses = ["aa", "garbage"]
    ids = torch.zeros((2, 3), dtype=torch.long)
    batch = RolloutBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones_like(ids),
                         prompt_length=1, responses=responses, clipped=torch.zeros(2, dtype=torch.bool))
    scored = scoring.score_rollout(rewards, samples, batch, 2, 4)
    garbage = 2.0 * echo_reward("a x2:", "garbage", "aa")  # the judge's failure adds 0
    assert scored.rewards.tolist() == pytest.approx([2.0 * 1.0 + 0.5 * 2.0, garbage])
    totals = scoring.rollout_sums([scored])
    metrics = scoring.reward_metrics(totals, ["reward/echo_reward", "reward/reward_model"])
    assert metrics["reward_model/failures"] == 1.0 and metrics["reward_model/score_mean"] == 2.0
    assert metrics["reward/reward_model"] == 1.0 and metrics["reward_model/s"] > 0
    assert score_all(rewards, samples * 2, responses) == pytest.approx([3.0, garbage])


def test_without_data_reward_the_model_is_the_only_reward(tmp_path):
    config = _config(path=str(make_reward_model(tmp_path / "rm")))
    assert data_spec(config).rewards == ()  # not the echo task's own
    config.data.reward_weights = [1.0, 2.0]
    with pytest.raises(ValueError, match="reward_weights has 2 entries for 0 reward function.* give 1"):
        data_spec(config)


def test_config_problems(tmp_path):
    assert reward_model.problems(_config()) == []
    found = " | ".join(check(_config(path=str(tmp_path), judge_url="ftp://x", timeout_s=0, retries=-1,
                                     judge_prompt="no field"), 1))
    for piece in ("reward_model.path and reward_model.judge_url are set", "has no config.json",
                  "judge_url must be an http", "judge_prompt must contain {response}", "timeout_s must be a positive",
                  "retries must be an integer >= 0"):
        assert piece in found
    served = " | ".join(reward_model.problems(_config(judge_model=str(tmp_path), judge_port=-1,
                                                      judge_max_model_len=0, judge_server_args=[])))
    for piece in ("judge_model %s is not a model directory" % tmp_path, "judge_port must be a port number",
                  "judge_max_model_len must be a positive number or null", "judge_server_args must be a mapping"):
        assert piece in served
    assert ("needs vLLM, which is not installed" in served) == (importlib.util.find_spec("vllm") is None)
    # The judge server's keys do nothing without judge_model: refused, as every inert key is.
    assert reward_model.problems(_config(judge_url="http://x/v1", judge_port=8000, judge_kv_cache_gib=1.0)) == [
        "reward_model.judge_port, reward_model.judge_kv_cache_gib: set only with reward_model.judge_model (the "
        "judge server the run starts)"]
    assert "judge_answer_regex is not a regular expression" in " ".join(
        reward_model.problems(_config(judge_url="http://x/v1", judge_answer_regex="(")))


def test_a_constrained_judge_asks_for_the_score_form_and_an_unconstrained_one_does_not(judge_url):
    """judge_constrained: vLLM's structured outputs (a regex) go with each call to judge_model's server always,
    to judge_url only when asked (another OpenAI-compatible endpoint may refuse the field)."""
    sample, asked = [Sample(prompt="p")], []
    for constrained in (None, True, False):
        Judge.requests.clear()
        JudgeReward(RewardModelConfig(judge_url=judge_url, judge_prompt="Response: {response}\n",
                                      judge_constrained=constrained)).score(sample, ["abc"], None)
        asked.append(Judge.requests[0].get("structured_outputs"))
    assert asked == [None, {"regex": r"[0-9]{1,2}(\.[0-9])?"}, None]
    Judge.requests.clear()
    served = RewardModelConfig(judge_model="/some/model", judge_prompt="Response: {response}\n",
                               judge_answer_regex="[0-9]")
    assert JudgeReward(served, judge_url).score(sample, ["abcd"], None) == [4.0]  # judge_model's server, by URL
    assert Judge.requests[0]["structured_outputs"] == {"regex": "[0-9]"}


def test_the_judge_server_is_started_as_rollout_servers_are_with_its_own_keys():
    """judge_model's server: the rollout servers' launcher (guard, log, readiness) with the judge's port, context,
    KV cache and arguments; the device's variables and arguments, the user's last."""
    from engine.rl.judge_server import judge_server_options, judge_server_spec
    from engine.rollout.vllm_server.manager import ServerManager

    facts = accel_backends.get_backend("cpu").inference_engine_facts()
    section = RewardModelConfig(judge_model="/models/judge", judge_max_model_len=512, judge_kv_cache_gib=2.0,
                                judge_server_args={"max_num_seqs": 8, "seed": 3})
    assert judge_server_options(section, facts) == {"enforce_eager": True, "seed": 3, "generation_config": "vllm",
                                                    "max_model_len": 512, "enable_chunked_prefill": False,
                                                    "max_num_seqs": 8}
    spec = judge_server_spec(section, facts, free_port=lambda: 4321)
    assert spec.port == 4321 and spec.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and spec.cores == []
    assert "--max-model-len 512" in " ".join(spec.arguments) and "--no-enable-chunked-prefill" in spec.arguments
    assert judge_server_spec(RewardModelConfig(judge_port=8123), facts, free_port=lambda: 1).port == 8123
    command = ServerManager("/models/judge", [spec], "/tmp/logs").command(spec)
    assert command[2] == "engine.rollout.vllm_server.guard" and "vllm.entrypoints.openai.api_server" in command
    assert "--skip-tokenizer-init" not in command  # a chat server: the judge's own tokenizer and chat template


def test_a_causal_lm_as_reward_model_path_is_refused_in_one_line_before_any_worker(tmp_path, capsys):
    """Issue 45: a causal LM there failed late, in every worker, in 13 lines."""
    from engine.grpo import cli

    causal = tmp_path / "causal"
    causal.mkdir()
    (causal / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    status = cli.main([f"reward_model.path={causal}", f"run.output_dir={tmp_path / 'runs'}", "run.name=refused"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert f"reward_model.path {causal} is a Qwen2ForCausalLM, not a sequence-classification model" in err[0]
    assert not (tmp_path / "runs").exists()
    two = tmp_path / "two"
    two.mkdir()
    (two / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForSequenceClassification"]}))
    assert reward_model.classifier_problems(str(two)) == [
        f"reward_model.path {two} has 2 labels: a reward model has one (num_labels=1), as accel-rm exports it"]
    assert reward_model.classifier_problems(str(make_reward_model(tmp_path / "rm"))) == []
