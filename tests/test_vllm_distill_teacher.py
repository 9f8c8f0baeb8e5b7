"""A distillation teacher on a vLLM server for real (the vLLM leg, ci/test-vllm.sh): vLLM's CPU build serves the
student's own model directory and ``accel-distill teacher.server_url=...`` (one rank) trains against its prompt
log-probs. The check before any worker passes (the server's tokenizer splits the probe texts as the student's
does), every step's reverse KL is ~0 (the served teacher's log-probs of the student's tokens equal the student's
own to vLLM's float error, so the rows, positions and parsing are right; a wrong position or row would give a gap
of several nats), and a teacher served with another tokenizer is refused in one line before any worker.
Skipped where vLLM is not importable."""

import json
import os
import time

import pytest

# The leg's marks and skip, the model size: as the colocated engine's tests.
from test_vllm_engine_ranks import HIDDEN, pytestmark  # noqa: F401 - pytestmark: pytest reads it here


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One vLLM server serving a tiny chat model, as the rollout engine would start it."""
    from accel_backends.backends.cpu import CPUBackend
    from accel_backends.spawn import free_port
    from engine.demo_model import make_tiny_model
    from engine.rollout.engines.vllm_settings import VLLMConfig
    from engine.rollout.vllm_server.manager import ServerManager
    from engine.rollout.vllm_server.plan import server_options, server_specs

    model_dir = make_tiny_model(tmp_path_factory.mktemp("teacher"), hidden_size=HIDDEN, layers=2, eos_bias=0.0)
    settings = VLLMConfig(mode="server", kv_cache_gib=1.0)
    facts = CPUBackend().inference_engine_facts()
    options = server_options(settings, facts, "float32", "auto", 128)
    manager = ServerManager(model_dir, server_specs(settings, facts, None, options, free_port),
                            tmp_path_factory.mktemp("server-logs"))
    started = time.perf_counter()
    (url,) = manager.start()
    print(f"server ready in {time.perf_counter() - started:.1f} s")
    before = os.environ.get("VLLM_API_KEY")
    os.environ["VLLM_API_KEY"] = manager.api_key  # teacher.server_url: a user's server, its key given this way
    yield model_dir, url
    manager.stop()
    if before is None:
        os.environ.pop("VLLM_API_KEY")
    else:
        os.environ["VLLM_API_KEY"] = before


def _distill(tmp_path, argv):
    from engine.train import cli
    from engine.train.registry import get_recipe

    return cli.main(get_recipe("distill"), ["--nproc", "1", "run.progress=false", f"run.output_dir={tmp_path}",
                                            "run.name=served", "data.task=echo", "rollout.n=4",
                                            "rollout.max_new_tokens=8", "train.prompts_per_step=4", *argv])


def test_a_student_distils_from_a_teacher_on_a_vllm_server(served, tmp_path, monkeypatch):
    model_dir, url = served
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    code = _distill(tmp_path, [f"model.path={model_dir}", f"teacher.server_url={url}", "train.steps=2",
                               "engine.lr=1e-5"])  # step 2: the student has barely moved from the teacher
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "served" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["response_length"] > 1 and row["distill/teacher_s"] > 0
        assert abs(row["distill/reverse_kl"]) < 1e-3 and row["distill/advantage_abs"] < 1e-3, row


def test_a_served_teacher_with_another_tokenizer_is_refused_before_any_worker(served, tmp_path, monkeypatch, capsys):
    from distill_models import char_model_dir

    _, url = served
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    student = char_model_dir(tmp_path / "student")  # the character tokenizer, not the served model's BPE
    assert _distill(tmp_path, [f"model.path={student}", f"teacher.server_url={url}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differs from the student's" in err[0] and not (tmp_path / "served").exists(), err
