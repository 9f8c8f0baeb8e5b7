"""rollout.vllm.mode=server for real (the vLLM leg, ci/test-vllm.sh): vLLM's CPU build as separate servers, weights
pushed over this package's weight-transfer engine (accel, registered inside them through vllm.general_plugins, under
both its names) on the CPU backend's weight group (gloo).

One server, shared by the module (started by the same plan the engine uses), takes pushes from FSDP2 and LoRA
policies on 1 and 2 trainer ranks: its log-probs of fixed token sequences equal the trainer's after a push and
differ before it (so the check can fail; tests/vllm_push_compare.py, shared with the colocated engine's test), its
sampled tokens' log-probs equal the trainer's, it reports every pushed version, and a server serving another model
is refused before any weight is sent. With rollout.vllm.weight_sync=delta (1 and 2 ranks) the first push goes whole,
then after each of three updates moving 5% of the elements a delta far smaller than the model leaves the server's
log-probs equal bit for bit to those after a whole push of the same weights; a server whose version is not the
trainer's last push (as after a restart: relabelled here) gets the next push whole, and is exact. A push while
requests decode (rollout.partial) switches them to the new version's label and weights mid-response (pause mode
keep) or lets them finish first (wait); accel- grpo runs ahead of the trainer against it with rollout.max_staleness
1 (one rank) and 2 (two ranks, partial), the recorded staleness never above the bound and above 0 at least once, and
so does accel-ppo (max_staleness 1); a run resumed from a checkpoint samples ahead from the checkpoint's weights
(borrowing the server's core while it idles). The CPU demo on 2 ranks with a server it starts learns as with the
colocated engine (max_staleness 0) until a Ctrl-C (the step is saved, the server stopped), and a run sampling ahead
whose server is killed ends within a bounded time with one line naming it and no process left behind. The server
(issue 45) listens on loopback only, every process of it, and refuses a request without its key on every route.
Skipped where vLLM is not importable.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest
from conftest import REPO, run_python
from distributed import run_ranks

# The leg's marks and skip, the vLLM environment and the model size: as the colocated engine's tests.
from test_vllm_engine_ranks import ENV, HIDDEN, pytestmark  # noqa: F401 - pytestmark: pytest reads it here
from vllm_push_compare import (
    assert_adapter_pushed,
    assert_delta_pushed,
    assert_pushed,
    big_update,
    delta_push_and_compare,
    largest_gap,
    perturb,
    push_adapter_and_compare,
    push_and_compare,
    trainer_log_probs,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from engine.demo_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("served-model"), hidden_size=HIDDEN, layers=2, eos_bias=0.0)


@pytest.fixture(scope="module")
def server_manager(model_dir, tmp_path_factory):
    """One vLLM server with this package's weight-transfer engine, as the engine would start it. It wants the key
    its manager drew: the tests reach it as a user reaches a server of theirs (rollout.vllm.server_urls), with the
    key in VLLM_API_KEY (each rank's and each run's environment inherits it)."""
    from accel_backends.backends.cpu import CPUBackend
    from accel_backends.spawn import free_port
    from engine.rollout.engines.vllm_settings import VLLMConfig
    from engine.rollout.vllm_server.manager import ServerManager
    from engine.rollout.vllm_server.plan import server_options, server_specs

    settings = VLLMConfig(mode="server", kv_cache_gib=1.0)
    facts = CPUBackend().inference_engine_facts()
    options = server_options(settings, facts, "float32", "auto", 128, lora_rank=4)  # adapters too (lora_sync)
    manager = ServerManager(model_dir, server_specs(settings, facts, None, options, free_port),
                            tmp_path_factory.mktemp("server-logs"))
    started = time.perf_counter()
    manager.start()
    print(f"server ready in {time.perf_counter() - started:.1f} s")
    before = os.environ.get("VLLM_API_KEY")
    os.environ["VLLM_API_KEY"] = manager.api_key
    yield manager
    manager.stop()
    if before is None:
        os.environ.pop("VLLM_API_KEY")
    else:
        os.environ["VLLM_API_KEY"] = before


@pytest.fixture(scope="module")
def server(server_manager):
    """The server's base URL."""
    return server_manager.specs[0].url


def _server_log_probs(client, batch, model=None):
    """The server's log-probs of each response token of ``batch`` as a fixed sequence (temperature 1), with the
    LoRA adapter named ``model`` where given."""
    import torch

    rows, width, start = len(batch), batch.response_ids.size(1), batch.prompt_length
    result = torch.zeros(rows, width)
    for row in range(rows):
        sequence = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
        answer = client.call("POST", "/inference/v1/generate", {
            "token_ids": sequence, "output_mode": "tokens", **({"model": model} if model else {}),
            "sampling_params": {"max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0, "detokenize": False}})
        prompt_length = int(batch.attention_mask[row, :start].sum())
        for t in range(int(batch.response_mask[row].sum())):
            entry = answer["prompt_logprobs"][prompt_length + t]
            result[row, t] = entry[str(sequence[prompt_length + t])]["logprob"]
    return result


def _push_checks(rank, model_dir, url):
    import time

    import torch
    from transformers import AutoTokenizer

    from engine import EngineConfig, FSDPEngine
    from engine.rl.algorithms.grpo.config import RolloutConfig
    from engine.rollout import eos_token_ids, rollout, sync_weights
    from engine.rollout.engines import RolloutContext, SamplingConfig, create_rollout_engine
    from engine.rollout.engines.vllm_settings import VLLMConfig

    out = {}
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    policy = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2, lr=0.05, max_grad_norm=1e9))
    config = RolloutConfig(engine="vllm", vllm=VLLMConfig(mode="server", server_urls=[url]))
    engine = create_rollout_engine("vllm", RolloutContext(policy, tokenizer, str(model_dir), config, 96))
    client = engine.clients[0]
    started = time.perf_counter()
    sync_weights(policy, engine)
    out["push_s"] = [time.perf_counter() - started]
    eos = tuple(eos_token_ids(policy.module, tokenizer))
    prompts = [f"how many apples does {name} have {rank}" for name in ("Tom", "Maria", "Sam")]

    sampled = SamplingConfig(n=4, max_new_tokens=16, eos_token_ids=eos, temperature=0.7, top_k=20, top_p=0.8,
                             log_probs=True)
    torch.manual_seed(1234 + rank)
    batch = rollout(engine, tokenizer, prompts, sampled)
    mask = batch.response_mask.float()
    out["tokens"] = int(mask.sum())
    out["sampled_gap"] = largest_gap(batch.sampling_log_probs, trainer_log_probs(policy, batch, 0.7, 20, 0.8), mask)
    compared, _ = push_and_compare(policy, engine, batch, lambda b: _server_log_probs(client, b), model_dir)
    out.update(compared)
    out["push_s"].append(compared["push_after_update_s"])
    out["versions"] = (engine.pusher.version, client.weight_version())
    engine.generate([[5, 6, 7]], sampled)  # the version check passes after the last push
    started = time.perf_counter()
    out["adapter"] = _adapter_push_checks(model_dir, url, tokenizer, batch, sampled)
    out["adapter_checks_s"] = time.perf_counter() - started  # what lora_sync=adapter adds to the test
    started = time.perf_counter()
    out["delta"] = _delta_push_checks(model_dir, url, tokenizer, batch)
    out["delta_checks_s"] = time.perf_counter() - started
    return out


def _delta_push_checks(model_dir, url, tokenizer, batch):
    """rollout.vllm.weight_sync=delta against the same server (tests/vllm_push_compare.py); then the server
    relabelled with another version, as a restarted server reports: the next push whole, and exact."""
    import torch

    from engine import EngineConfig, FSDPEngine
    from engine.rl.algorithms.grpo.config import RolloutConfig
    from engine.rollout import sync_weights
    from engine.rollout.engines import RolloutContext, create_rollout_engine
    from engine.rollout.engines.vllm_settings import VLLMConfig

    policy = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2))
    config = RolloutConfig(engine="vllm", vllm=VLLMConfig(mode="server", server_urls=[url], weight_sync="delta"))
    engine = create_rollout_engine("vllm", RolloutContext(policy, tokenizer, str(model_dir), config, 96))
    client, pusher = engine.clients[0], engine.pusher
    out = delta_push_and_compare(policy, engine, batch, lambda b: _server_log_probs(client, b),
                                 lambda: pusher.sent.drop() if pusher.sent is not None else None)
    both_ranks = torch.distributed.barrier if torch.distributed.is_initialized() else lambda: None
    if policy.rank == 0:
        client.start_weight_update()
        client.finish_weight_update("restarted")  # what the trainer sees of a server that restarted
    both_ranks()
    perturb(policy, 0.05, seed=7 + policy.rank)
    out["after_restart_bytes"] = sync_weights(policy, engine)
    mask = batch.response_mask.float()
    out["after_restart_gap"] = largest_gap(_server_log_probs(client, batch), trainer_log_probs(policy, batch), mask)
    out["sender"] = pusher.sender
    return out


def _adapter_push_checks(model_dir, url, tokenizer, batch, sampled):
    """rollout.vllm.lora_sync=adapter against the same server: the base once, then the adapter alone over the
    weight group, written on the server's side and loaded under the version's name (tests/vllm_push_compare.py);
    the server lists this run's two newest adapters only; sampling names the newest and labels its tokens."""
    import torch

    from engine import EngineConfig, FSDPEngine
    from engine.rl.algorithms.grpo.config import RolloutConfig
    from engine.rollout import rollout
    from engine.rollout.engines import RolloutContext, create_rollout_engine
    from engine.rollout.engines.vllm_settings import VLLMConfig

    lora = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2, lr=0.05, max_grad_norm=1e9, lora_rank=4))
    config = RolloutConfig(engine="vllm", vllm=VLLMConfig(mode="server", server_urls=[url], lora_sync="adapter"))
    engine = create_rollout_engine("vllm", RolloutContext(lora, tokenizer, str(model_dir), config, 96))
    client = engine.clients[0]
    out = push_adapter_and_compare(lora, engine, batch, lambda b: _server_log_probs(client, b, engine.pusher.adapter))
    session = engine.pusher.session
    out["served"] = sorted(m["id"] for m in client.models() if session in m["id"])
    out["adapter"], out["versions"] = engine.pusher.adapter, (engine.pusher.version, client.weight_version())
    torch.manual_seed(7)
    prompts = ["how many apples does Tom have"]
    spans = engine.sample([tokenizer(p)["input_ids"] for p in prompts], sampled, 11)[1]
    out["span_versions"] = sorted({span["version"] for row in spans for span in row})
    out["sampled"] = int(rollout(engine, tokenizer, prompts, sampled).response_mask.sum())
    both_ranks = torch.distributed.barrier if torch.distributed.is_initialized() else lambda: None
    both_ranks()  # no rank still samples with the adapter when rank 0 closes
    engine.close()  # rank 0 unloads the run's adapters from a server it did not start
    both_ranks()  # every rank looks after rank 0 has closed
    out["served_after_close"] = sorted(m["id"] for m in client.models() if session in m["id"])
    return out


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_server_samples_the_pushed_policy(model_dir, server, ranks):
    outs = run_ranks(_push_checks, model_dir, server, world_size=ranks, env=ENV, timeout=400, fresh=True)
    for out in outs:
        assert out["tokens"] > 8
        assert out["sampled_gap"] < 1e-4, out  # temperature 0.7, top-k 20, top-p 0.8, from the server
        assert_pushed(out)
        assert out["versions"] == (3, "3"), out  # three pushes, each reported by the server
        adapter = out["adapter"]
        assert_adapter_pushed(adapter)
        session = adapter["adapter"].split("-")[2]
        assert adapter["versions"] == (4, "4"), adapter  # the base (1), then adapters 2, 3 and 4
        assert adapter["served"] == [f"accel-policy-{session}-v3", f"accel-policy-{session}-v4"], adapter
        assert adapter["span_versions"] == ["4"] and adapter["sampled"] > 0, adapter
        assert adapter["served_after_close"] == [], adapter  # unloaded when the run ends
        delta = out["delta"]
        assert_delta_pushed(delta, sender=delta["sender"])
        assert delta["after_restart_bytes"] == (delta["model_bytes"] if delta["sender"] else 0), delta
        assert delta["after_restart_gap"] < 1e-4, delta
    print({"push_s": [[round(s, 3) for s in out["push_s"]] for out in outs],
           "adapter_push_s": [round(out["adapter"]["push_after_update_s"], 3) for out in outs],
           "adapter_checks_s": [round(out["adapter_checks_s"], 1) for out in outs],
           "delta_checks_s": [round(out["delta_checks_s"], 1) for out in outs]})


def test_a_server_with_another_model_is_refused_before_any_weight(server, server_manager, model_dir):
    """...and (issue 45) the server listens on loopback only, every process of it, and refuses a request without
    its key on every route, vLLM's development routes included."""
    import urllib.error
    import urllib.request

    from listeners import exposed, listening, process_group
    from transformers import AutoConfig

    from engine.rollout.vllm_server.client import ServerClient, ServerError
    from engine.rollout.vllm_server.model_signature import signature_of
    from engine.rollout.vllm_server.pusher import WeightPusher

    signature = {**signature_of(AutoConfig.from_pretrained(model_dir)), "num_hidden_layers": 4}
    pusher = WeightPusher([ServerClient(server)], [1], "127.0.0.1", signature, sender=True,
                          settings={"timeout_s": 60.0})
    with pytest.raises(ServerError) as refused:
        pusher.connect()
    assert "runs another model than the trainer's (num_hidden_layers: served 2, trainer 4)" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert ServerClient(server).healthy()  # refused at the handshake: the server lives on
    pids = process_group(server_manager.processes[0].pid)  # the guard, the API server, its engine core
    port = server_manager.specs[0].port
    assert ("127.0.0.1", port) in listening(pids) and exposed(pids) == [], listening(pids)
    for method, path in (("GET", "/server_info"), ("POST", "/collective_rpc"), ("GET", "/health"),
                         ("GET", "/v1/models"), ("POST", "/pause"), ("POST", "/inference/v1/generate")):
        request = urllib.request.Request(server + path, data=b"{}" if method == "POST" else None, method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 401, (path, refused.value.code)
    assert ServerClient(server, api_key=server_manager.api_key).call("GET", "/server_info")  # the wire's routes: on


SMALL = ["train.prompts_per_step=4", "rollout.n=4", "train.micro_batch_size=8", "rollout.max_new_tokens=12",
         "run.progress=false", "rollout.engine=vllm", "rollout.vllm.mode=server", "rollout.vllm.kv_cache_gib=1",
         "data.max_prompt_tokens=64", "data.task=gsm8k"]


def _data(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Tom has {i} apples", "answer": str(i)}) + "\n"
                            for i in range(16)))
    return data


def _processes_with(text):
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if text in " ".join(process.info["cmdline"] or []):
            found.append(process.info["pid"])
    return found


def _start_run(tmp_path, model_dir, port, nproc, name, *extra):
    """accel-grpo in server mode, a long run with a local server on ``port``, started in the background."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "ACCEL_BACKEND": "cpu",
           "OMP_NUM_THREADS": "1", **ENV}
    return subprocess.Popen([sys.executable, "-m", "engine.rl.algorithms.grpo.cli",
                             "--preset", "cpu-demo", "--nproc", str(nproc),
                             *SMALL,
                             f"model.path={model_dir}", f"data.path={_data(tmp_path)}", "train.steps=500",
                             f"rollout.vllm.server_port={port}", f"run.output_dir={tmp_path}", f"run.name={name}",
                             *extra], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rows_after(trainer, metrics, steps, timeout_s=400):
    """The run's metrics rows once it has logged ``steps`` steps (its server up and pushes done)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        if len(rows) >= steps:
            return rows
        assert trainer.poll() is None and time.monotonic() < deadline, trainer.communicate()[1][-3000:]
        time.sleep(0.5)


def _learned(rows):
    """The demo's criterion (tests/test_grpo_run.py): the last 10 steps' reward at least twice the first 10's and
    at least 0.6."""
    rewards = [row["reward_mean"] for row in rows]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    return len(rewards) >= 20 and last >= 2 * first and last >= 0.6


def test_the_demo_learns_on_two_ranks_with_a_server_it_starts_and_stops_on_ctrl_c(tmp_path):
    """max_staleness 0 (synchronous) learns the CPU demo as the colocated engine does (docs/perf.md: reward 0.11 ->
    0.71 in 200 steps); then a Ctrl-C ends the step, saves it and stops the server."""
    from accel_backends.spawn import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "ACCEL_BACKEND": "cpu",
           "OMP_NUM_THREADS": "1", **ENV}
    trainer = subprocess.Popen([sys.executable, "-m", "engine.rl.algorithms.grpo.cli", "rollout.engine=vllm",
                                "rollout.vllm.mode=server", "model.hidden_size=128", "rollout.vllm.kv_cache_gib=1",
                                "run.progress=false", "train.steps=400", "run.save_on_interrupt=true",
                                f"rollout.vllm.server_port={port}", f"run.output_dir={tmp_path}", "run.name=demo"],
                               env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "demo" / "metrics.jsonl"
    try:
        rows = _rows_after(trainer, metrics, 20)
        while not _learned(rows) and len(rows) < 300:
            rows = _rows_after(trainer, metrics, len(rows) + 10)
        trainer.send_signal(signal.SIGINT)  # the launcher forwards it; the step ends, is saved, the server stops
        _, stderr = trainer.communicate(timeout=180)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    rewards = [row["reward_mean"] for row in rows]
    print(f"server-mode demo reward: first 10 steps {sum(rewards[:10]) / 10:.3f}, last 10 of {len(rows)} steps "
          f"{sum(rewards[-10:]) / 10:.3f}")
    assert _learned(rows), rewards
    assert trainer.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert list((tmp_path / "demo" / "checkpoints").glob("step_*")), stderr[-3000:]
    for row in rows:
        assert row["rollout/weight_sync_s"] > 0 and row["rollout/staleness_max"] == 0
        assert row["rollout/logprob_diff_max"] < 1e-3, row  # the server samples the trainer's policy
    assert _processes_with(f"--port {port}") == []  # stopped with the run
    print({"weight_sync_s": statistics.median(row["rollout/weight_sync_s"] for row in rows),
           "step_time_s": statistics.median(row["step_time_s"] for row in rows)})


def test_a_killed_server_ends_the_run_in_bounded_time_naming_it(tmp_path, model_dir):
    """With a sampler thread running ahead (max_staleness 1): whichever notices first, the thread's request or
    the trainer's push, the run ends with one line naming the server. Its server, started by the run, runs on the
    core that rollout.vllm.borrow_threads=auto gave it, every process of it."""
    import psutil

    from accel_backends.spawn import free_port
    from engine.rollout.vllm_server.client import ServerClient, ServerError
    from engine.runtime import usable_cores

    port = free_port()
    trainer = _start_run(tmp_path, model_dir, port, 1, "killed", "rollout.max_staleness=1")
    try:
        _rows_after(trainer, tmp_path / "killed" / "metrics.jsonl", 1)
        with pytest.raises(ServerError, match="answered 401"):  # up, and wanting the run's key (not the test's)
            ServerClient(f"http://127.0.0.1:{port}", api_key="").call("GET", "/health")
        (guard,) = [pid for pid in _processes_with(f"--port {port}") if "vllm_server.guard" in
                    " ".join(psutil.Process(pid).cmdline())]
        # rollout.vllm.borrow_threads=auto (the default) with a server this run starts on the CPU: on 2 cores or
        # more the server gets the last core and the trainer borrows it while it idles; on 1, nothing is borrowed.
        chosen = json.loads((tmp_path / "killed" / "config.json").read_text())["derived"]["borrow_threads"]
        server = [psutil.Process(guard), *psutil.Process(guard).children(recursive=True)]
        if usable_cores() >= 2:
            last = max(psutil.Process().cpu_affinity())
            assert chosen["threads"] == 1 and chosen["server_cores"] == [[last]], chosen
            assert {tuple(p.cpu_affinity()) for p in server} == {(last,)}, chosen  # API server, engine, worker
        else:
            assert chosen["threads"] == 0 and "cannot give each" in chosen["why"], chosen
        killed = time.monotonic()
        os.killpg(guard, signal.SIGKILL)  # the whole server: API server, engine core, worker, guard
        _, stderr = trainer.communicate(timeout=120)
        ended_s = time.monotonic() - killed
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.returncode == 1, stderr[-3000:]
    (error,) = [line for line in stderr.splitlines() if line.startswith("accel-grpo: error:")]
    assert f"ServerError: vLLM server http://127.0.0.1:{port} is unreachable" in error, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert ended_s < 60
    assert _processes_with(f"--port {port}") == []
    print({"ended_after_kill_s": round(ended_s, 1)})


# -- asynchronous training (rollout.max_staleness > 0) -------------------------------------------------------------


def _sample_during_a_push(engine, policy, tokenizer, prompts, sampling, delay_s):
    """Sample ``prompts`` in a thread as the sampler thread does, push the (updated) policy ``delay_s`` later:
    the batch, each row's weight-version spans, and the version labels before and after the push."""
    import threading
    import time

    import torch

    from engine.rollout import rollout, sync_weights
    from engine.rollout.staleness import VersionRecorder

    result, before = {}, engine.weight_version

    def sample():
        recorder = VersionRecorder(engine, torch.Generator().manual_seed(7))
        result["batch"] = rollout(recorder, tokenizer, prompts, sampling)
        result["spans"] = recorder.spans

    thread = threading.Thread(target=sample)
    thread.start()
    time.sleep(delay_s)
    sync_weights(policy, engine)
    thread.join(120)
    return result["batch"], result["spans"], before, engine.weight_version


def _partial_checks(rank, model_dir, url):
    """Pushes while requests are in flight: in pause mode keep (rollout.partial=true) a response switches to the
    new version's label mid-way and its later tokens are the new weights'; in mode wait it finishes on the old."""
    import torch
    from transformers import AutoTokenizer

    from engine import EngineConfig, FSDPEngine
    from engine.rl.algorithms.grpo.config import RolloutConfig
    from engine.rollout import rollout, sync_weights
    from engine.rollout.engines import RolloutContext, SamplingConfig, create_rollout_engine
    from engine.rollout.engines.vllm_settings import VLLMConfig

    out = {"partial": [], "wait": []}
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    policy = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2, lr=0.05, max_grad_norm=1e9))
    config = RolloutConfig(engine="vllm", vllm=VLLMConfig(mode="server", server_urls=[url]), max_staleness=1,
                           partial=True)
    engine = create_rollout_engine("vllm", RolloutContext(policy, tokenizer, str(model_dir), config, 96))
    out["pause_mode"] = engine.pusher.pause_mode
    sync_weights(policy, engine)
    prompts = [f"how many apples does {name} have" for name in ("Tom", "Maria", "Sam", "Ana")]
    long = SamplingConfig(n=8, max_new_tokens=100, eos_token_ids=(), temperature=1.0, log_probs=True)
    import time

    rollout(engine, tokenizer, prompts[:1], SamplingConfig(n=2, max_new_tokens=8, eos_token_ids=()))  # warm
    started = time.perf_counter()
    rollout(engine, tokenizer, prompts, long)
    full_s = time.perf_counter() - started  # the delays are fractions of it: a fast machine decodes in a blink
    out["full_s"] = full_s
    for mode in ("partial", "wait"):
        engine.pusher.pause_mode = "keep" if mode == "partial" else "wait"
        for fraction in (0.2, 0.35, 0.5, 0.1, 0.7):  # until a push lands while the requests are decoding
            delay_s = fraction * full_s
            probe = rollout(engine, tokenizer, prompts[:1], SamplingConfig(n=2, max_new_tokens=8, eos_token_ids=()))
            big_update(policy, probe)  # the policy moves; the server has the old weights until the push
            batch, spans, old, new = _sample_during_a_push(engine, policy, tokenizer, prompts, long, delay_s)
            split = [row for row, s in enumerate(spans) if len(s) > 1]
            record = {"old": old, "new": new, "labels": sorted({span["version"] for s in spans for span in s}),
                      "split_rows": len(split), "rows": len(spans), "delay_s": delay_s}
            if mode == "partial" and split:
                after = trainer_log_probs(policy, batch)  # the new weights' log-probs of every sampled token
                switched, unswitched = (torch.zeros_like(batch.response_mask, dtype=torch.bool) for _ in range(2))
                for row in split:
                    (first, second) = spans[row]
                    record.setdefault("spans", []).append((first["version"], second["version"], first["end"],
                                                           second["start"]))
                    switched[row, second["start"]:] = True
                    unswitched[row, :second["start"]] = True
                mask = batch.response_mask.bool()
                gap = (batch.sampling_log_probs - after).abs()
                record["after_switch_gap"] = float(gap[switched & mask].max())  # new weights after the switch
                record["before_switch_gap"] = float(gap[unswitched & mask].max())  # old weights before it
            out[mode].append(record)
            if (mode == "partial" and split) or (mode == "wait" and len(record["labels"]) == 1 and fraction >= 0.35):
                break
    return out


def test_a_partial_rollouts_tokens_after_a_push_carry_the_new_version(model_dir, server):
    (out,) = run_ranks(_partial_checks, model_dir, server, world_size=1, env=ENV, timeout=400, fresh=True)
    assert out["pause_mode"] == "keep"  # rollout.partial=true
    partial = out["partial"][-1]
    assert partial["split_rows"] > 0, out  # a push landed while responses were decoding
    for first, second, end, start in partial["spans"]:
        assert (first, second) == (partial["old"], partial["new"]) and end == start > 0, partial
    assert partial["after_switch_gap"] < 1e-3, partial  # the tokens after the switch: the new weights'
    assert partial["before_switch_gap"] > 0.05, partial  # and before it the old ones' (so the check can fail)
    wait = out["wait"][-1]
    assert wait["split_rows"] == 0 and wait["labels"] == [wait["old"]], out  # mode wait: finished on the old weights
    print({"full_s": out["full_s"], **{mode: [(r["delay_s"], r["split_rows"], r["rows"]) for r in out[mode]]
                                        for mode in ("partial", "wait")}})


def _grpo_against(tmp_path, model_dir, url, nproc, name, *extra, cli="engine.rl.algorithms.grpo.cli"):
    """accel-grpo (or the recipe of ``cli``) in server mode against the module's running server (no server to
    start)."""
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "ACCEL_BACKEND": "cpu",
           "OMP_NUM_THREADS": "1", **ENV}
    return run_python(["-m", cli, "--preset", "cpu-demo", "--nproc", str(nproc), *SMALL,
                       f"model.path={model_dir}", f"data.path={_data(tmp_path)}", f"rollout.vllm.server_urls=[{url}]",
                       f"run.output_dir={tmp_path}", f"run.name={name}", *extra], env=env, timeout=400)


@pytest.mark.parametrize("bound, nproc, partial", [(1, 1, "false"), (2, 2, "true")])
def test_grpo_ahead_of_the_trainer_stays_within_the_staleness_bound(tmp_path, model_dir, server, bound, nproc,
                                                                    partial):
    result = _grpo_against(tmp_path, model_dir, server, nproc, "ahead", "train.steps=6",
                           f"rollout.max_staleness={bound}", f"rollout.partial={partial}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "ahead" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]
    staleness = [row["rollout/staleness_max"] for row in rows]
    assert all(0 <= s <= bound for s in staleness), staleness
    assert max(staleness) > 0, staleness  # it did sample ahead (so the check above can fail)
    assert rows[0]["rollout/staleness_max"] == 0  # the first step's batch: sampled with the first push
    assert max(row["rollout/sampler_busy_frac"] for row in rows) > 0
    for row in rows:
        assert row["rollout/dropped_stale"] == 0 and 0 <= row["rollout/staleness_mean"] <= bound
        assert row["rollout/weight_sync_s"] > 0 and row["time/trainer_wait_s"] >= 0
        assert 0 <= row["rollout/sampler_busy_frac"] <= 1.0 + 1e-6, row
        assert row["rollout_tokens_produced"] > 0 and row["rollout/is_ratio_max"] > 0
    print({"staleness_max": staleness, "trainer_wait_s": [round(r["time/trainer_wait_s"], 2) for r in rows],
           "sampler_busy_frac": [round(r["rollout/sampler_busy_frac"], 2) for r in rows],
           "step_time_s": [round(r["step_time_s"], 2) for r in rows]})


def test_ppo_samples_ahead_of_the_trainer_against_a_server(tmp_path, model_dir, server):
    """accel-ppo (issue 37 item 4: every rollout engine and the asynchronous mode) against the server with
    rollout.max_staleness 1: the critic's values and GAE on batches sampled ahead, within the bound."""
    result = _grpo_against(tmp_path, model_dir, server, 1, "ppo", "train.steps=3", "rollout.max_staleness=1",
                           cli="engine.rl.algorithms.ppo.cli")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    staleness = [row["rollout/staleness_max"] for row in rows]
    assert all(0 <= s <= 1 for s in staleness) and max(staleness) == 1, staleness
    for row in rows:
        assert row["rollout/weight_sync_s"] > 0 and row["rollout/dropped_stale"] == 0, row
        assert row["critic/vf_loss"] >= 0 and row["critic/lr"] > 0, row
    assert rows[-1]["updates"] == 1.0  # critic.warmup_steps=1 (the preset): the policy trains from step 2 on
    print({"staleness_max": staleness, "step_time_s": [round(r["step_time_s"], 2) for r in rows]})


def test_a_resumed_run_samples_ahead_from_its_checkpoints_weights(tmp_path, model_dir, server):
    """Six steps at max_staleness 1 (the policy moving every update), then the same run resumed from its step-3
    checkpoint (step 6's removed). The server still holds step 6's weights; the resume pushes the checkpoint's
    before the sampler thread begins, so the first resumed step trains on a batch of staleness 0 whose engine
    log-probs equal the trainer's, where three updates' drift would show (one update's already does, in the
    straight run). With 2 cores the trainer also borrows the server's core while it idles
    (rollout.vllm.borrow_threads)."""
    import shutil

    from engine.runtime import usable_cores

    borrow = ["rollout.vllm.borrow_threads=1"] if usable_cores() >= 2 else []
    # The tiny model earns no reward here (zero advantages): the entropy bonus moves the policy every update.
    common = ("train.steps=6", "run.save_every=3", "rollout.max_staleness=1", "algorithm.entropy_coeff=0.1", *borrow)
    straight = _grpo_against(tmp_path, model_dir, server, 1, "resume", *common)
    assert straight.returncode == 0, straight.stderr[-3000:]
    metrics = tmp_path / "resume" / "metrics.jsonl"
    before = [json.loads(line) for line in metrics.read_text().splitlines()]
    shutil.rmtree(tmp_path / "resume" / "checkpoints" / "step_000006")
    resumed = _grpo_against(tmp_path, model_dir, server, 1, "resume", *common, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in after] == [1, 2, 3, 4, 5, 6] and after[:3] == before[:3]  # went on from 3
    first = after[3]
    assert first["rollout/staleness_max"] == 0 and first["rollout/logprob_diff_max"] < 1e-4, first
    drift = max(row["rollout/logprob_diff_max"] for row in before if row["rollout/staleness_max"] == 1)
    assert drift > 1e-3, before  # one update moves the log-probs visibly: step 6's weights would have failed
    assert all(row["rollout/staleness_max"] <= 1 and row["rollout/dropped_stale"] == 0 for row in after[3:])
    print({"first_resumed_diff": first["rollout/logprob_diff_max"], "one_update_drift": drift})


def test_the_plugin_registers_one_receiving_engine_under_both_names():
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from engine.rollout.vllm_server import plugin

    plugin.register()
    plugin.register()  # vLLM loads general plugins more than once per process
    engines = {name: WeightTransferEngineFactory._registry[name]() for name in plugin.ENGINE_NAMES}
    assert {cls.__name__ for cls in engines.values()} == {"AccelWeightTransferEngine"}
