"""Who may reach what a run starts (issue 45 item 2): the vLLM servers' command lines and environments (127.0.0.1
unless a host is named, ``--host`` always given, a key per run in the environment and never on the command line,
vLLM's development routes for the rollout servers only), the key middleware on every path, every client sending
the key, the host keys' checks, and the weight wire's store: bound to the trainer's address, refusing a peer
without the run's secret. No vLLM here: the real servers are checked in the vLLM leg (test_vllm_server_ranks.py,
test_vllm_judge.py)."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import threading

import pytest
from listeners import exposed, listening

from accel_backends.backends.cpu import CPUBackend
from engine.rl.reward_model import RewardModelConfig
from engine.rollout.engines.vllm_settings import VLLMConfig
from engine.rollout.vllm_server import access, wire_store
from engine.rollout.vllm_server.client import ServerClient, ServerError
from engine.rollout.vllm_server.manager import ServerManager
from engine.rollout.vllm_server.plan import server_options, server_specs

FACTS = CPUBackend().inference_engine_facts()


def _rollout_manager(tmp_path, **settings):
    settings = VLLMConfig(mode="server", **settings)
    options = server_options(settings, FACTS, "float32", "auto", 128)
    return ServerManager(tmp_path / "model", server_specs(settings, FACTS, None, options, lambda: 4321), tmp_path)


def _flag(command, name):
    return command[command.index(name) + 1]


def test_rollout_servers_listen_on_loopback_with_the_runs_key_and_the_wires_routes(tmp_path, monkeypatch):
    monkeypatch.setenv(access.KEY_ENV, "the-users-own-key")  # a key in the trainer's environment is not the run's
    manager = _rollout_manager(tmp_path)
    (spec,) = manager.specs
    command, env = manager.command(spec), manager.environment(spec)
    server = command[command.index("vllm.entrypoints.openai.api_server"):]
    assert _flag(server, "--host") == "127.0.0.1" and _flag(server, "--port") == "4321"
    assert _flag(server, "--middleware") == "engine.rollout.vllm_server.access.KeyMiddleware"
    assert spec.url == "http://127.0.0.1:4321"
    assert len(manager.api_key) >= 40 and manager.api_key != "the-users-own-key"
    assert env[access.KEY_ENV] == manager.api_key and not any(manager.api_key in part for part in command)
    assert env[access.DEV_MODE_ENV] == "1"  # /pause, /update_weights...: the weight wire needs them
    assert _rollout_manager(tmp_path).api_key != manager.api_key  # a key per run
    exposed_on_purpose = _rollout_manager(tmp_path, host="0.0.0.0")
    (spec,) = exposed_on_purpose.specs
    assert _flag(exposed_on_purpose.command(spec), "--host") == "0.0.0.0" and spec.url == "http://127.0.0.1:4321"
    assert access.url_for("::", 80) == "http://[::1]:80" and access.url_for("10.1.2.3", 80) == "http://10.1.2.3:80"


def test_the_judge_server_listens_on_its_host_with_a_key_and_never_in_dev_mode(tmp_path, monkeypatch):
    from engine.rl.judge_server import judge_server_spec

    monkeypatch.setenv(access.DEV_MODE_ENV, "1")  # even when the trainer's environment turns them on
    for host, url in (("127.0.0.1", "http://127.0.0.1:5555"), ("10.1.2.3", "http://10.1.2.3:5555")):
        section = RewardModelConfig(judge_model=str(tmp_path), judge_host=host)
        spec = judge_server_spec(section, FACTS, lambda: 5555)
        manager = ServerManager(tmp_path, [spec], tmp_path)
        command, env = manager.command(spec), manager.environment(spec)
        assert _flag(command, "--host") == host and spec.url == url
        assert access.DEV_MODE_ENV not in env and env[access.KEY_ENV] == manager.api_key
        assert "--middleware" in command and manager.api_key not in " ".join(command)


def _asgi(middleware, path, headers=(), kind="http"):
    """What ``middleware`` answers to one request: ``("app", path)`` when it lets it through, else the status."""
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": path, "method": "GET", "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(middleware(scope, None, send))
    if sent and sent[0]["type"] == "app":
        return ("app", sent[0]["path"])
    return sent[0].get("status", sent[0].get("code"))


def test_the_key_middleware_refuses_every_path_without_the_key(monkeypatch):
    async def app(scope, receive, send):
        await send({"type": "app", "path": scope["path"]})

    monkeypatch.setenv(access.KEY_ENV, "k3y")
    guarded = access.KeyMiddleware(app)
    # vLLM's own check leaves these open: development, RL and tokenizer routes, health, sagemaker's /invocations
    for path in ("/collective_rpc", "/server_info", "/pause", "/update_weights", "/tokenize", "/health",
                 "/invocations", "/v1/models"):
        assert _asgi(guarded, path) == 401
        assert _asgi(guarded, path, [("Authorization", "Bearer wrong")]) == 401
        assert _asgi(guarded, path, [("Authorization", "Basic k3y")]) == 401
        assert _asgi(guarded, path, [("authorization", "Bearer k3y")]) == ("app", path)
    assert _asgi(guarded, "/v1/realtime", kind="websocket") == 1008
    monkeypatch.delenv(access.KEY_ENV)
    assert _asgi(access.KeyMiddleware(app), "/health", [("Authorization", "Bearer ")]) == 401  # no key: fails closed


class _Recorder:
    """A stand-in HTTP server recording each request's path and Authorization header; answers 401 to ``refuse``."""

    def __init__(self, refuse=False):
        self.seen, self.refuse = [], refuse

    def __enter__(self):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                outer.seen.append((self.path.split("?")[0], self.headers.get("Authorization")))
                body = json.dumps({"data": [{"id": "judge"}], "weight_version": "1",
                                   "choices": [{"message": {"content": "7"}}]}).encode()
                self.send_response(401 if outer.refuse else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815 - http.server's names

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc):
        self.httpd.shutdown()


def test_every_client_sends_the_key(monkeypatch):
    from engine.rl.judge import JudgeReward
    from engine.rl.scorers import Sample
    from engine.rollout.vllm_server.pusher import WeightPusher

    monkeypatch.delenv(access.KEY_ENV, raising=False)
    recorder = _Recorder()
    with recorder as url:
        client = ServerClient(url, api_key="run-key")
        assert client.healthy() and client.models() == [{"id": "judge"}] and client.weight_version() == "1"
        client.call("POST", "/tokenize", {"prompt": "x"})
        pusher = WeightPusher([client], [1], "127.0.0.1", {}, sender=True)
        pusher._pause()
        client.resume()
        client.update_weights({})
        judge = JudgeReward(RewardModelConfig(judge_model="/m", judge_name=None), url + "/v1", api_key="run-key")
        assert judge.score([Sample(prompt="p")], ["r"], None) == [7.0]
        paths = [path for path, _ in recorder.seen]
        assert paths == ["/health", "/v1/models", "/weight_info", "/tokenize", "/pause", "/resume", "/update_weights",
                         "/v1/models", "/v1/chat/completions"]
        assert {header for _, header in recorder.seen} == {"Bearer run-key"}
        recorder.seen.clear()
        ServerClient(url).models()  # a server the user started, no key given: none sent
        monkeypatch.setenv(access.KEY_ENV, "users-key")
        ServerClient(url).models()  # ... or the one the user gives in VLLM_API_KEY
        assert [header for _, header in recorder.seen] == [None, "Bearer users-key"]
    with _Recorder(refuse=True) as url, pytest.raises(ServerError, match="answered 401 \\(the server refused this key"):
        ServerClient(url, api_key="stale").models()


def test_the_host_keys_are_checked_in_one_line_each(monkeypatch):
    from engine.rl import reward_model
    from engine.rl.algorithms.grpo.config import build_config, check
    from engine.rollout.vllm_server.settings import server_problems

    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    config = build_config(None, None, ["rollout.engine=vllm", "model.hidden_size=128", "rollout.vllm.mode=server",
                                       "rollout.vllm.host=my host!"])
    assert config.rollout.vllm.host == "my host!"
    expected = ("rollout.vllm.host must be an IP address or host name of this machine to listen on (127.0.0.1: this "
                "machine only; 0.0.0.0: every interface, reachable by anyone on the network), got 'my host!'")
    assert expected in check(config, 2)
    for good in ("127.0.0.1", "0.0.0.0", "::1", "trn0", "node-3.cluster.local"):
        assert server_problems(VLLMConfig(mode="server", host=good), FACTS) == []
    for bad in ("", "http://x", "999.1.1.1", 8000, None, "a..b"):
        (problem,) = server_problems(VLLMConfig(mode="server", host=bad), FACTS)
        assert problem.startswith("rollout.vllm.host must be an IP address") and "\n" not in problem
    assert server_problems(VLLMConfig(host="0.0.0.0"), FACTS) == [
        "rollout.vllm.host=0.0.0.0 is where the vLLM servers this run starts listen: it needs rollout.vllm.mode=server "
        "(this run colocates, nothing listens); remove it"]
    assert server_problems(VLLMConfig(mode="server", host="0.0.0.0", server_urls=["http://a:1"]), FACTS) == [
        "rollout.vllm.host=0.0.0.0 is where the servers this run starts listen, and it starts none "
        "(rollout.vllm.server_urls): remove it"]
    assert server_problems(VLLMConfig(mode="server", server_args={"host": "0.0.0.0", "api-key": "x"}), FACTS) == [
        "rollout.vllm.server_args.host: set rollout.vllm.host (a server's address and key are not api_server "
        "arguments here)",
        "rollout.vllm.server_args.api-key: the run draws a key for its servers and sends it itself (a server's "
        "address and key are not api_server arguments here)"]
    assert ("reward_model.judge_server_args.port: set reward_model.judge_port (a server's address and key are not "
            "api_server arguments here)") in reward_model.judge_model_problems(
        RewardModelConfig(judge_model="/nowhere", judge_server_args={"port": 1}))
    config = build_config(None, None, ["model.hidden_size=128", "reward_model.judge_url=http://j/v1",
                                       "reward_model.judge_host=0.0.0.0"])
    assert ("reward_model.judge_host: set only with reward_model.judge_model (the judge server the run starts)"
            in reward_model.problems(config))
    section = RewardModelConfig(judge_model="/nowhere", judge_host="bad host")
    assert ("reward_model.judge_host must be an IP address or host name of this machine to listen on (127.0.0.1: "
            "this machine only; 0.0.0.0: every interface, reachable by anyone on the network), got 'bad host'"
            in reward_model.judge_model_problems(section))


def test_the_weight_stores_listen_on_the_trainers_address_only_and_refuse_a_peer_without_the_secret():
    store = wire_store.host_store("127.0.0.1", 2, 10)
    mine = [entry for entry in listening([os.getpid()]) if entry[1] == store.port]
    assert mine == [("127.0.0.1", store.port)] and not [e for e in exposed([os.getpid()]) if e[1] == store.port]
    wire_store.join("127.0.0.1", store.port, 1, "not the run's secret", 10)
    with pytest.raises(wire_store.RefusedPeer) as refused:
        wire_store.admit(store, "the run's secret", [1], 10)
    assert str(refused.value).startswith("a process without this run's secret joined the weight group's store at ")
    assert "as rank 1: refused before any weight was sent" in str(refused.value)

    store = wire_store.host_store("127.0.0.1", 2, 10)  # a fresh group: the worker knows the secret
    joined = wire_store.join("127.0.0.1", store.port, 1, "the run's secret", 10)
    admitted = wire_store.admit(store, "the run's secret", [1], 10)
    joined.set("rendezvous", "worker's address")
    assert admitted.get("rendezvous") == b"worker's address"  # both meet under the same secret prefix
    nonce = store.get(wire_store.NONCE_KEY).decode()
    assert wire_store.group_prefix("the run's secret", nonce) != wire_store.group_prefix("a guess", nonce)
    assert not store.check([f"{wire_store.GROUP_PREFIX}/rendezvous"])  # not where a peer without the secret looks


class _Impostor(ServerClient):
    """A 'server' whose worker joins the trainer's weight-group store with a guessed secret (as a process that
    reached the store and the RL route without the run's secret would); its other routes answer nothing."""

    def call(self, method, path, body=None, query=None, timeout_s=None):
        info = (body or {}).get("init_info", {})
        if path == "/init_weight_transfer_engine" and not info.get("check_only"):
            assert len(info["secret"]) == 64  # the run's secret reaches the real server through the keyed route
            wire_store.join(info["master_address"], info["master_port"], 1, "a guess", 10)
        return None


def test_a_push_to_a_worker_without_the_secret_is_refused_before_any_weight():
    from engine.rollout.vllm_server.pusher import WeightPusher

    pusher = WeightPusher([_Impostor("http://srv0:8000")], [1], "127.0.0.1", {}, sender=True,
                          settings={"timeout_s": 60.0}, backend=CPUBackend())
    with pytest.raises(ServerError) as refused:
        pusher.connect()
    assert str(refused.value).startswith("a process without this run's secret joined the weight group's store at ")
    assert pusher.groups == []  # no group: nothing can be pushed
