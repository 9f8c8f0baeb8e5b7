"""Server mode's pure parts, without vLLM: the settings' checks, the weight-transfer engine each device names and
the servers a run would start with cuda's and npu's facts (recorded, not started), the command line, the weight
wire between two real processes (the CPU backend's gloo group), the guard that ends a server whose trainer died,
and the launcher's close / one-line-error path that the colocated engine's shutdown relies on."""

import dataclasses
import importlib.util
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from accel_backends import DeviceBackend
from accel_backends.backends.cpu import CPUBackend
from accel_backends.backends.cuda import CUDABackend
from accel_backends.backends.npu import NPUBackend
from engine import runtime
from engine.rollout.engines.registry import RolloutEngineError
from engine.rollout.engines.vllm_settings import VLLMConfig, check_settings
from engine.rollout.vllm_server import weight_wire, wire_store
from engine.rollout.vllm_server.manager import cli_arguments
from engine.rollout.vllm_server.model_signature import signature_differences
from engine.rollout.vllm_server.plan import server_options, server_specs
from engine.rollout.vllm_server.settings import local_servers, server_problems
from engine.runtime.teardown import at_group_end

CPU = CPUBackend()
GLOO = CPU.inference_engine_facts()


def _server(**fields):
    return VLLMConfig(mode="server", **fields)


# -- settings --------------------------------------------------------------------------------------------------


def test_every_device_takes_weights_through_this_packages_engine_unless_another_is_chosen():
    from engine.rollout.vllm_server.settings import transfer_engine

    for backend in (CPUBackend(), CUDABackend(), NPUBackend(), DeviceBackend()):  # a third party's too
        facts = backend.inference_engine_facts()
        assert facts.weight_transfer == "accel" and facts.weight_transfer_settings["timeout_s"] > 0
        assert transfer_engine(_server(), facts) == "accel"
    assert transfer_engine(_server(weight_transfer="nccl"), GLOO) == "nccl"  # vLLM's own, where it has one
    (bad,) = server_problems(_server(weight_transfer=""), GLOO)
    assert bad.startswith("rollout.vllm.weight_transfer must be a weight-transfer engine's name or null")


def test_server_settings_are_checked_as_one_line_each():
    assert server_problems(VLLMConfig(), GLOO) == []  # colocate: nothing to check
    assert server_problems(_server(), GLOO) == [] and local_servers(_server()) == 1
    assert local_servers(_server(server_urls=["http://h:1"])) == 0
    (bad_mode,) = server_problems(VLLMConfig(mode="remote"), GLOO)
    assert bad_mode == "rollout.vllm.mode must be one of colocate, server, got 'remote'"
    (both,) = server_problems(_server(servers=2, server_urls=["http://h:1"]), GLOO)
    assert "servers and rollout.vllm.server_urls are both set" in both
    (none,) = server_problems(_server(servers=0), GLOO)
    assert none.endswith("needs rollout.vllm.server_urls")
    (url,) = server_problems(_server(server_urls=["h:1"]), GLOO)
    assert url.startswith("rollout.vllm.server_urls must be a list of base URLs")
    (devices,) = server_problems(_server(servers=2, server_devices=["0"]), GLOO)
    assert "one entry per local server (2)" in devices
    (borrow,) = server_problems(VLLMConfig(borrow_threads=1), GLOO)
    assert borrow.startswith("rollout.vllm.borrow_threads=1 borrows the cores of idle vLLM servers: it needs "
                             "rollout.vllm.mode=server")
    (negative,) = server_problems(_server(borrow_threads=-1), GLOO)
    assert negative == "rollout.vllm.borrow_threads must be auto or an integer >= 0 (0: never borrow), got -1"
    (word,) = server_problems(_server(borrow_threads="many"), GLOO)
    assert word.startswith("rollout.vllm.borrow_threads must be auto or an integer") and word.endswith("'many'")
    assert server_problems(_server(borrow_threads=1), GLOO) == []
    assert server_problems(VLLMConfig(borrow_threads="auto"), GLOO) == []  # auto colocated: 0, nothing to refuse
    # This package's engine needs nothing of vLLM in the trainer, on any device; vLLM's nccl, when chosen, has its
    # trainer side in vLLM: without vLLM in the trainer's Python, one line.
    assert server_problems(_server(), CUDABackend().inference_engine_facts()) == []
    assert server_problems(_server(), NPUBackend().inference_engine_facts()) == []  # Ascend: was refused
    engine = server_problems(_server(weight_transfer="nccl"), CUDABackend().inference_engine_facts())
    if importlib.util.find_spec("vllm") is None:
        (line,) = engine
        assert line.startswith("rollout.vllm.mode=server: pushing into vLLM servers through their device's "
                               "weight-transfer engine needs vLLM in the trainer's Python too")
    else:
        assert engine == []
    # A server's tensor-parallel group is its own: it need not divide the trainer's ranks.
    assert check_settings(_server(tensor_parallel_size=2), 1, None) == []
    assert check_settings(VLLMConfig(tensor_parallel_size=2), 1, None)


# -- the servers a run starts, by device (recorded, not started) ------------------------------------------------


def _plan(facts, visible, **fields):
    settings = _server(**fields)
    ports = iter(range(30000, 30100))
    options = server_options(settings, facts, "bfloat16", "dummy", 96)
    return options, server_specs(settings, facts, visible, options, lambda: next(ports))


def test_cpu_servers_take_this_packages_engine_and_a_kv_cache_in_gib():
    options, (spec,) = _plan(GLOO, None, kv_cache_gib=1.0, server_args={"max_num_seqs": 8})
    assert options["weight_transfer_config"] == {"backend": "accel"} and "gpu_memory_utilization" not in options
    assert options["logprobs_mode"] == "processed_logprobs" and options["enable_scale_out"]
    assert spec.env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert spec.port == 30000 and spec.tensor_parallel_size == 1
    arguments = " ".join(spec.arguments)
    assert "--weight-transfer-config {\"backend\": \"accel\"}" in arguments and "--max-num-seqs 8" in arguments
    assert "--no-enable-chunked-prefill" in arguments and "--max-model-len 96" in arguments


@pytest.mark.parametrize("backend, chosen, visible, env", [
    (CUDABackend(), None, "CUDA_VISIBLE_DEVICES", {}),
    (CUDABackend(), "nccl", "CUDA_VISIBLE_DEVICES", {}),  # vLLM's own engine, chosen
    (NPUBackend(), None, "ASCEND_RT_VISIBLE_DEVICES", {"VLLM_ASCEND_ENABLE_NZ": "0"}),
], ids=["nvidia-gpu", "nvidia-gpu-vllm-nccl", "ascend-npu"])
def test_gpu_and_npu_servers_get_their_engine_devices_and_share(backend, chosen, visible, env):
    facts = backend.inference_engine_facts()
    assert backend.visible_devices_env == visible
    options, specs = _plan(facts, backend.visible_devices_env, servers=2, server_devices=["2,3", "4,5"],
                           tensor_parallel_size=2, gpu_memory_utilization=0.8, server_port=8100,
                           weight_transfer=chosen)
    assert options["weight_transfer_config"] == {"backend": chosen or "accel"}
    assert options["gpu_memory_utilization"] == 0.8
    assert [s.port for s in specs] == [8100, 8101] and [s.tensor_parallel_size for s in specs] == [2, 2]
    assert [s.env for s in specs] == [{**env, visible: "2,3"}, {**env, visible: "4,5"}]


def test_options_become_vllm_command_line_flags():
    assert cli_arguments({"max_model_len": 96, "enforce_eager": True, "enable_chunked_prefill": False,
                          "weight_transfer_config": {"backend": "accel"}, "dtype": None}) == [
        "--max-model-len", "96", "--enforce-eager", "--no-enable-chunked-prefill",
        "--weight-transfer-config", '{"backend": "accel"}']


def test_another_model_is_named_field_by_field():
    served = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128, "num_hidden_layers": 2}
    assert signature_differences(served, dict(served)) == []
    assert signature_differences(served, {**served, "hidden_size": 64}) == ["hidden_size: served 128, trainer 64"]


# -- the weight wire between two processes (the CPU backend's gloo group) -----------------------------------------


def _member(port, queue):
    group = weight_wire.open_group(weight_wire.backend_named("cpu"), "127.0.0.1", port, 1, 2, 60, "s3cret")
    # Plain values, not tensors: a tensor in a queue is shared through a file descriptor this process must outlive.
    queue.put([(name, str(t.dtype), tuple(t.shape), t.float().flatten().tolist()) for name, t in
               weight_wire.receive(group)])


def test_named_tensors_of_any_dtype_cross_the_weight_wire():
    import torch


    store = wire_store.host_store("127.0.0.1", 2, 60)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    member = context.Process(target=_member, args=(store.port, queue))
    member.start()
    group = weight_wire.open_group(CPU, "127.0.0.1", store.port, 0, 2, 60, "s3cret", store=store)
    assert type(group.group).__name__ == "ProcessGroupGloo" and group.device == torch.device("cpu")
    sent = [("model.layers.0.mlp.up_proj.weight", torch.randn(6, 4)), ("b", torch.randn(5).bfloat16()),
            ("scalar", torch.tensor(2.5)), ("empty", torch.zeros(0, 3)), ("ids", torch.arange(7))]
    for name, tensor in sent:
        weight_wire.send([group], name, tensor)
    weight_wire.send_end([group])
    received = queue.get(timeout=60)
    member.join(30)
    assert received == [(name, str(t.dtype), tuple(t.shape), t.float().flatten().tolist()) for name, t in sent]
    with pytest.raises(ValueError, match="cannot be sent"):
        weight_wire.send([group], "complex", torch.zeros(2, dtype=torch.complex64))


# -- the guard: no server outlives its trainer --------------------------------------------------------------------

_PARENT = """
import subprocess, sys, time
guard = subprocess.Popen([sys.executable, "-m", "engine.rollout.vllm_server.guard", "{pid}", "--", sys.executable,
                          "-c", "import time; time.sleep(600)"], start_new_session=True)
print(guard.pid, flush=True)
time.sleep(600)
"""


def _group_alive(group):
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_ends_when_its_trainer_is_killed():
    code = "import os, subprocess, sys; pid = os.getpid()\n" + _PARENT.replace('"{pid}"', "str(pid)")
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    guard = int(trainer.stdout.readline())
    time.sleep(1.0)
    assert _group_alive(guard)  # the guard and its "server" run in their own process group
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    started = time.monotonic()
    while _group_alive(guard) and time.monotonic() - started < 120:  # a loaded machine's bound, not a timing check
        time.sleep(0.1)
    assert not _group_alive(guard), "the server's process group outlived its trainer"


# -- closing before the process group goes; errors as one line -----------------------------------------------------


def _closes_and_fails(fail):
    import torch.distributed as dist

    import accel_backends

    accel_backends.get_backend("cpu").init_distributed()
    seen = []
    at_group_end(lambda: seen.append(dist.is_initialized()))
    at_group_end(lambda: (_ for _ in ()).throw(OSError("disk gone")))  # a failing close is one line, not a raise
    if fail:
        raise RolloutEngineError("rollout engine 'vllm' failed to generate: ValueError: prompt too long")
    return seen


def test_engines_close_while_the_group_exists_and_their_errors_are_one_line(capfd):
    assert runtime.run(_closes_and_fails, 1, False) == [True]  # closed after the function, before the group went
    assert "note: shutting down" in capfd.readouterr().err
    with pytest.raises(runtime.WorkerFailed) as failed:
        runtime.run(_closes_and_fails, 1, True)
    assert str(failed.value) == ("rank 0 failed: RolloutEngineError: rollout engine 'vllm' failed to generate: "
                                 "ValueError: prompt too long")
    assert failed.value.details() == ""  # no traceback for an error that says everything


def test_facts_stay_a_frozen_dataclass():
    assert dataclasses.is_dataclass(GLOO)
    with pytest.raises(dataclasses.FrozenInstanceError):
        GLOO.weight_transfer = "x"


def test_an_unreachable_server_url_is_one_line_before_any_worker_starts(monkeypatch):
    from engine.rl.algorithms.grpo.config import build_config, check

    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    config = build_config(None, None, ["rollout.engine=vllm", "model.hidden_size=128", "rollout.vllm.mode=server",
                                       "rollout.vllm.server_urls=[http://127.0.0.1:9]"])
    assert config.rollout.vllm.server_urls == ["http://127.0.0.1:9"]
    assert check(config, 2) == ["rollout.vllm.server_urls: the vLLM server at http://127.0.0.1:9 is unreachable (no "
                                "answer to /health): start it, or correct the URL"]
    config = build_config(None, None, ["rollout.engine=vllm", "model.hidden_size=128", "rollout.vllm.mode=remote"])
    assert "rollout.vllm.mode must be one of colocate, server, got 'remote'" in check(config, 2)


class _NoEngineServer:
    """A stand-in HTTP server: refuses the weight-transfer handshake as a vLLM server without the engine does, and
    lacks the RL routes' /weight_info (404, as without VLLM_SERVER_DEV_MODE=1)."""

    def __enter__(self):
        import http.server
        import json
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._answer(500, {"error": "Invalid weight transfer backend: accel. Available engines: ['nccl']"})

            def do_GET(self):  # noqa: N802
                self._answer(404, {"detail": "Not Found"})

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc):
        self.httpd.shutdown()


def test_a_server_without_the_engine_or_the_rl_routes_is_one_line():
    from engine.rollout.vllm_server.client import ServerClient, ServerError
    from engine.rollout.vllm_server.pusher import WeightPusher

    with _NoEngineServer() as url:
        pusher = WeightPusher([ServerClient(url)], [1], "127.0.0.1", {}, sender=True, settings={"timeout_s": 5.0})
        with pytest.raises(ServerError) as refused:
            pusher.connect()
        message = str(refused.value)
        assert message.startswith(f"vLLM server {url}: POST /init_weight_transfer_engine answered 500: ")
        assert "Invalid weight transfer backend: accel" in message and "\n" not in message
        assert message.endswith("(it registers the engine through vllm.general_plugins)")
        assert "--weight-transfer-config '{\"backend\": \"accel\"}'" in message
        with pytest.raises(ServerError, match="answered 404 \\(the RL routes need VLLM_SERVER_DEV_MODE=1"):
            ServerClient(url).weight_version()
    with pytest.raises(ServerError, match="is unreachable .*check the URL and that the server is running"):
        ServerClient("http://127.0.0.1:9").models()


class _RecordingGenerateServer:
    """A stand-in vLLM server: records each /inference/v1/generate request and answers ``n`` choices whose tokens
    are the prompt's first id + 100 + choice index, with log-prob -0.5 each; reports weight version ``version``."""

    def __init__(self, version):
        self.version, self.requests = version, []

    def __enter__(self):
        import http.server
        import json
        import threading

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                first, params = body["token_ids"][0], body["sampling_params"]
                choices = [{"index": k, "token_ids": [first + 100 + k] * (k + 1),
                            "logprobs": {"content": [{"token_id": first + 100 + k, "logprob": -0.5}] * (k + 1)}}
                           for k in reversed(range(params["n"]))]  # out of order: the client sorts them
                self._answer({"choices": choices})

            def do_GET(self):  # noqa: N802
                self._answer({"weight_version": outer.version})

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self, f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc):
        self.httpd.shutdown()


def test_requests_are_spread_over_the_servers_and_the_version_is_checked_first():
    import torch

    from engine.rollout.engines import SamplingConfig
    from engine.rollout.vllm_server.client import ServerClient, ServerError
    from engine.rollout.vllm_server.engine import VLLMServerRolloutEngine
    from engine.rollout.vllm_server.pusher import WeightPusher

    with _RecordingGenerateServer("3") as (first, url_a), _RecordingGenerateServer("3") as (second, url_b):
        engine = object.__new__(VLLMServerRolloutEngine)  # its parts, without starting or connecting anything
        engine.rank, engine.clients = 1, [ServerClient(url_a), ServerClient(url_b)]
        engine.pusher = WeightPusher(engine.clients, [1, 1], "127.0.0.1", {}, sender=False)
        engine.pusher.version = 3
        sampling = SamplingConfig(n=2, max_new_tokens=5, eos_token_ids=(7,), temperature=0.7, top_k=20, top_p=0.8,
                                  log_probs=True)
        responses = engine.generate([[10, 11], [20], [30, 31, 32]], sampling)
        # Rank 1 sends prompt i to server (i + 1) mod 2: prompts 0 and 2 to the second server, 1 to the first.
        assert [r["token_ids"] for r in first.requests] == [[20]]
        assert sorted(r["token_ids"] for r in second.requests) == [[10, 11], [30, 31, 32]]
        params = first.requests[0]["sampling_params"]
        assert {k: params[k] for k in ("n", "max_tokens", "stop_token_ids", "temperature", "top_k", "top_p",
                                       "logprobs", "detokenize", "repetition_penalty")} == {
            "n": 2, "max_tokens": 5, "stop_token_ids": [7], "temperature": 0.7, "top_k": 20, "top_p": 0.8,
            "logprobs": 0, "detokenize": False, "repetition_penalty": 1.0}
        seeds = sorted(r["sampling_params"]["seed"] for r in first.requests + second.requests)
        assert seeds[1] - seeds[0] == 2 and seeds[2] - seeds[1] == 2  # a seed per prompt, n apart
        assert responses.token_ids[:, 0].tolist() == [110, 111, 120, 121, 130, 131]  # prompt order, choice order
        assert responses.mask.sum(dim=1).tolist() == [1, 2, 1, 2, 1, 2]
        assert torch.equal(responses.log_probs, -0.5 * responses.mask.float())
        second.version = "2"  # a server still on an older version: no sample from it
        with pytest.raises(ServerError, match=f"vLLM server {url_b} reports weight version '2', the trainer pushed 3"):
            engine.generate([[10]], sampling)


_HEALTH_SERVER = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args):
        pass
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def _stand_in_manager(tmp_path, code, **options):
    """A ServerManager whose 'server' is a small script under the real guard (no vLLM)."""
    from accel_backends.spawn import free_port
    from engine.rollout.vllm_server.manager import ServerManager, ServerSpec

    class StandIn(ServerManager):
        def command(self, spec):
            return [self.python, "-m", "engine.rollout.vllm_server.guard", str(os.getpid()), "--", self.python, "-c",
                    code, str(spec.port)]

    return StandIn(tmp_path / "model", [ServerSpec(free_port())], tmp_path / "logs", **options)


def test_the_manager_waits_for_health_stops_every_process_and_tidies_its_logs(tmp_path):
    manager = _stand_in_manager(tmp_path, _HEALTH_SERVER, start_timeout_s=60, remove_logs=True)
    (url,) = manager.start()
    assert url == manager.specs[0].url and manager.alive() == [True]
    group = manager.processes[0].pid
    manager.stop()
    deadline = time.monotonic() + 10  # the last ones may wait a moment to be reaped
    while _group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(group) and not (tmp_path / "logs").exists()  # a clean stop leaves nothing


def test_a_server_that_dies_while_starting_is_named_with_its_log(tmp_path):
    from engine.rollout.vllm_server.client import ServerError

    code = "import sys; print('RuntimeError: no model in /nowhere', flush=True); sys.exit(3)"
    manager = _stand_in_manager(tmp_path, code, start_timeout_s=60, remove_logs=True)
    with pytest.raises(ServerError) as failed:
        manager.start()
    message = str(failed.value)
    assert message.startswith("vLLM server 0 (port ") and "exited while starting: RuntimeError: no model" in message
    assert (tmp_path / "logs" / "server-0.log").is_file()  # kept: the error names it
