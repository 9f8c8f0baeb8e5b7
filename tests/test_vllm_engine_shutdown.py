"""Issue 28's two vLLM bugs, for real (the vLLM leg): a one-process run with rollout.engine=vllm used to end with a
shutdown traceback (``ValueError: Invalid process group specified``: vLLM tore its collectives down at the
interpreter's exit, after the launcher had destroyed the process group), and an error raised inside vLLM reached
the user as vLLM's traceback. Now the engine closes while the group exists, and its errors are one line."""

import pytest
from conftest import REPO, run_python
from test_vllm_engine_ranks import ENV, HIDDEN, pytestmark  # noqa: F401 - pytestmark: pytest reads it here

RUN = {"PYTHONPATH": str(REPO / "tests"), "ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1", **ENV}

FAILS_INSIDE_VLLM = """
import sys
from engine import runtime

def work(model_dir):
    import accel_backends
    from transformers import AutoTokenizer
    from engine import EngineConfig, FSDPEngine
    from engine.rl.algorithms.grpo.config import RolloutConfig
    from engine.rollout.engines import RolloutContext, SamplingConfig, create_rollout_engine

    accel_backends.get_backend().init_distributed()
    policy = FSDPEngine(model_dir, EngineConfig(fsdp_version=2))
    context = RolloutContext(policy, AutoTokenizer.from_pretrained(model_dir), model_dir,
                             RolloutConfig(engine="vllm"), max_sequence_tokens=32)
    engine = create_rollout_engine("vllm", context)
    engine.generate([list(range(5, 69))], SamplingConfig(n=1, max_new_tokens=4, eos_token_ids=(1,)))

try:
    runtime.run(work, 1, sys.argv[1])
except runtime.WorkerFailed as failed:
    print("details:", repr(failed.details()))
    print("message:", failed)
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from engine.demo_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model"), hidden_size=HIDDEN, layers=2)


def test_a_one_process_vllm_run_ends_without_a_shutdown_traceback(tmp_path):
    result = run_python(["-m", "engine.rl.algorithms.grpo.cli",
                         "--nproc", "1", "rollout.engine=vllm", f"model.hidden_size={HIDDEN}",
                         "train.steps=1", "run.progress=false", f"run.output_dir={tmp_path}", "run.name=one"],
                        env=RUN, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Invalid process group" not in result.stderr, result.stderr[-3000:]
    assert (tmp_path / "one" / "metrics.jsonl").is_file()


def test_an_error_inside_vllm_is_one_line_and_the_engine_still_closes(model_dir):
    result = run_python(["-c", FAILS_INSIDE_VLLM, str(model_dir)], env=RUN, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "details: ''" in result.stdout, result.stdout  # no traceback to print
    (message,) = [line for line in result.stdout.splitlines() if line.startswith("message:")]
    assert message.startswith("message: rank 0 failed: RolloutEngineError: rollout engine 'vllm' failed to generate: "
                              "VLLMValidationError: This model's maximum context length is 32 tokens"), message
    assert "Traceback" not in result.stderr and "Invalid process group" not in result.stderr, result.stderr[-3000:]
