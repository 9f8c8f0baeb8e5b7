"""Failures are failures (issue 45, item 4): every way a judge call can fail (a slow drip past timeout_s, a body cut
short, a reply that is not HTTP, one too big, a score no float32 reward holds) is a counted failure, retried within
reward_model.retries, never an exception that ends the run nor a score that makes the reward inf; a step where more
than reward_model.max_failure_frac of the responses failed stops the run in one line naming the URL and the cause;
a judge_url that does not answer is refused before any worker starts; a non-finite reward or loss stops the run."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.rl import reward_model
from engine.rl.judge import JudgeReward
from engine.rl.judge_http import MAX_REPLY_BYTES
from engine.rl.prompt_types import Sample
from engine.rl.reward_model import RewardModelConfig
from engine.rl.rewards import Reward
from engine.rl.step_metrics import require_finite
from engine.runtime import OneLineError


def _chat(content: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


class Misbehaving(BaseHTTPRequestHandler):
    """Answers each chat call as its response (after 'Response: ') asks: 'drip' sends a valid reply a few bytes at
    a time (each read quick, the whole slow), 'cut' half of its declared body, 'garbage' no HTTP at all, 'huge' a
    valid reply longer than the limit, 'e300' the score 1e300, 'error' HTTP 500; anything else scores 7."""

    calls: dict = {}

    def log_message(self, *args):
        pass

    def do_GET(self):  # /models
        data = json.dumps({"data": [{"id": "misbehaving"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        kind = body["messages"][0]["content"].split("Response: ")[1]
        Misbehaving.calls[kind] = Misbehaving.calls.get(kind, 0) + 1
        try:
            self._answer(kind)
        except OSError:  # the client gave up (the point of the drip)
            pass

    def _answer(self, kind: str) -> None:
        if kind == "garbage":
            self.wfile.write(b"this is not HTTP at all\r\n\r\n")
            self.close_connection = True
            return
        data = {"e300": b'{"choices": [{"message": {"content": "{\\"score\\": 1e300}"}}]}',
                "huge": _chat("Score: 5" + " " * (MAX_REPLY_BYTES + 10))}.get(kind, _chat("Score: 7"))
        if kind == "error":
            self.send_error(500, "judge overloaded")
            return
        self.send_response(200)
        if kind != "huge":  # the huge reply declares no length: the limit holds while reading
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if kind == "cut":
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if kind == "drip":  # every read returns well within timeout_s; the whole reply takes ~8 of them
            for start in range(0, len(data), 8):
                self.wfile.write(data[start:start + 8])
                self.wfile.flush()
                time.sleep(0.1)
            return
        self.wfile.write(data)
        self.close_connection = kind == "huge"


@pytest.fixture(scope="module")
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _judge(url: str, **keys) -> JudgeReward:
    return JudgeReward(RewardModelConfig(judge_url=url, judge_prompt="Response: {response}", **keys))


@pytest.mark.parametrize(("kind", "cause"), [
    ("drip", "no complete reply within reward_model.timeout_s=0.3 s"),
    ("cut", "reply cut short (36 of 72 bytes)"),  # Content-Length promised more than came
    ("garbage", "not an HTTP reply"),
    ("huge", f"reply longer than {MAX_REPLY_BYTES} bytes refused"),
    ("e300", "no usable score"),
    ("error", "answered HTTP 500"),
])
def test_every_judge_failure_is_retried_then_counted_with_its_cause(judge_url, kind, cause):
    Misbehaving.calls.clear()
    judge = _judge(judge_url, timeout_s=0.3, retries=1)
    scores = judge.score([Sample(prompt="p")] * 2, [kind, "fine"], None)
    assert scores == [0.0, 7.0]  # the failed one scores 0, its neighbour is untouched
    assert judge.take_stats()["reward_model_failures"] == 1.0
    assert Misbehaving.calls[kind] == 2  # retries=1: asked twice
    assert cause in judge.last_failure, judge.last_failure


def _stats(judge: JudgeReward, responses: list[str]) -> dict:
    judge.score([Sample(prompt="p")] * len(responses), responses, None)
    return reward_model.rank_sums([judge.take_stats()])


def test_a_step_with_more_failures_than_max_failure_frac_stops_in_one_line(judge_url):
    judge = _judge(judge_url, timeout_s=5.0, retries=0)
    rewards = [Reward(judge_url, judge, "model", 1.0)]
    # Two ranks' figures summed, as the loop's reduction hands them to the step's row: 3 of 4 failed.
    one, two = _stats(judge, ["error", "fine"]), _stats(judge, ["garbage", "error"])
    totals = {key: one[key] + two[key] for key in one}
    with pytest.raises(OneLineError) as stopped:
        reward_model.stop_on_failures(rewards, totals, step=4)
    line = str(stopped.value)
    assert "\n" not in line and "step 5: 3 of 4 responses could not be scored by " + judge_url in line
    assert "reward_model.max_failure_frac=0.5" in line and "last failure: " in line
    assert "answered HTTP 500" in line or "not an HTTP reply" in line
    # At the limit (2 of 4), or with a higher limit, the step goes on; without a reward model there is nothing.
    reward_model.stop_on_failures(rewards, _stats(judge, ["error", "fine", "garbage", "fine"]), step=0)
    judge.section.max_failure_frac = 0.8
    reward_model.stop_on_failures(rewards, totals, step=4)
    reward_model.stop_on_failures([], {"sequences": 4.0}, step=4)


def test_max_failure_frac_is_checked():
    section = RewardModelConfig(judge_url="http://x/v1", max_failure_frac=1.5)

    class Config:
        reward_model = section

    assert "reward_model.max_failure_frac must be a number in [0, 1], got 1.5" in reward_model.problems(Config)


def test_a_judge_that_does_not_answer_is_refused_before_any_worker(tmp_path, capsys):
    from engine.grpo import cli

    with socket.socket() as probe:  # a port nothing listens on (9, discard, where it is closed)
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    for url in ("http://127.0.0.1:9/v1", f"http://127.0.0.1:{closed}/v1"):
        status = cli.main([f"reward_model.judge_url={url}", f"run.output_dir={tmp_path}", "run.name=refused"])
        err = capsys.readouterr().err.strip().splitlines()
        assert status != 0 and len(err) == 1, err
        assert f"reward_model.judge_url {url}: unreachable" in err[0]
        assert not (tmp_path / "refused").exists()  # refused before the run directory, before any worker


def test_a_judge_that_answers_passes_the_check(judge_url):
    assert _judge(judge_url).reachability_problem() is None


def test_a_non_finite_reward_or_loss_stops_the_run():
    require_finite({"reward_mean": 1.0, "loss": 0.5, "critic/vf_loss": 0.1, "grad_norm": float("inf")}, step=2)
    with pytest.raises(OneLineError, match=r"step 3: reward_mean is inf, loss is nan: not a finite number"):
        require_finite({"reward_mean": float("inf"), "loss": float("nan")}, step=2)
    with pytest.raises(OneLineError, match="critic/vf_loss is nan"):
        require_finite({"reward_mean": 0.0, "critic/vf_loss": float("nan")}, step=0)


def test_eval_refuses_a_judge_that_does_not_answer(tmp_path):
    from engine.rl.algorithms.grpo.config import GRPOConfig
    from engine.rl.evaluate import problems

    config = GRPOConfig()
    config.data.val_path = str(tmp_path / "val.jsonl")
    (tmp_path / "val.jsonl").write_text('{"prompt": "p"}\n')
    config.reward_model.judge_url = "http://127.0.0.1:9/v1"
    assert [p for p in problems(config, {}, 1) if "unreachable" in p] == [
        "reward_model.judge_url http://127.0.0.1:9/v1: unreachable (Connection refused): start the judge, or correct "
        "the URL (checked before any worker starts)"]


KEY = "judge-key-from-the-environment"


class FailsAfterStepOne(BaseHTTPRequestHandler):
    """A judge wanting ``Authorization: Bearer KEY`` (401 without it) that scores the first ``budget`` chat calls
    (step 1's responses) and answers every later one 503, as a judge that falls over mid-run."""

    budget, posts, unauthorized = 4, 0, 0

    def log_message(self, *args):
        pass

    def _allowed(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {KEY}":
            return True
        FailsAfterStepOne.unauthorized += 1
        self.send_error(401, "no key")
        return False

    def do_GET(self):
        if self._allowed():
            Misbehaving.do_GET(self)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if not self._allowed():
            return
        FailsAfterStepOne.posts += 1
        if FailsAfterStepOne.posts > FailsAfterStepOne.budget:
            self.send_error(503, "judge fell over")
            return
        data = _chat("Score: 7")
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_judge_failing_mid_run_stops_it_in_one_line_and_its_key_comes_from_the_environment(
        tmp_path, capsys, monkeypatch):
    from engine.grpo import cli

    server = ThreadingHTTPServer(("127.0.0.1", 0), FailsAfterStepOne)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    common = [f"reward_model.judge_url={url}", "reward_model.judge_api_key_env=TEST_JUDGE_KEY",
              "reward_model.retries=0", "train.prompts_per_step=2", "rollout.n=2", "train.prompts_per_update=2",
              "train.micro_batch_size=4", "rollout.max_new_tokens=8", "train.steps=3", "run.progress=false",
              f"run.output_dir={tmp_path}"]
    try:
        status = cli.main([*common, "run.name=judged"])
        err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
        monkeypatch.delenv("TEST_JUDGE_KEY")
        unset = cli.main([*common, "run.name=unset"])
        unset_err = capsys.readouterr().err.strip().splitlines()
    finally:
        server.shutdown()
        server.server_close()
    assert status != 0 and FailsAfterStepOne.unauthorized == 0  # every call carried the key from the environment
    stop = [line for line in err if "could not be scored" in line]
    assert len(stop) == 1 and f"step 2: 4 of 4 responses could not be scored by {url}" in stop[0], err
    assert "answered HTTP 503" in stop[0] and "Traceback" not in "\n".join(err), err
    rows = (tmp_path / "judged" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == [1]  # step 1 scored and logged; step 2 never trained
    assert KEY not in (tmp_path / "judged" / "config.json").read_text()
    assert unset != 0 and len(unset_err) == 1 and "the environment variable TEST_JUDGE_KEY is not set" in unset_err[0]


def test_judge_api_key_env_is_a_variable_name_never_the_key(monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    judge = _judge("http://127.0.0.1:9/v1", judge_api_key_env="TEST_JUDGE_KEY")
    assert judge.headers()["Authorization"] == f"Bearer {KEY}"
    assert "Authorization" not in _judge("http://127.0.0.1:9/v1").headers()

    class Config:
        reward_model = RewardModelConfig(judge_url="http://x/v1", judge_api_key_env="sk-abc/123")

    said = [line for line in reward_model.problems(Config) if "judge_api_key_env" in line]
    assert len(said) == 1 and "NAME of an environment variable" in said[0] and "sk-abc" not in said[0]
    Config.reward_model = RewardModelConfig(path="/m", judge_api_key_env="TEST_JUDGE_KEY")
    assert any("set it only with judge_url" in line for line in reward_model.problems(Config))
