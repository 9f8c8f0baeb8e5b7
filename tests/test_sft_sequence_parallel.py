"""accel-sft with sequence parallelism (engine.sequence_parallel_size=2, issue 30), on real gloo ranks.

Exactness: one sp group of 2 ranks (FSDP2, fp32), each computing SFT's chunked cross-entropy on its slice of every
packed micro-batch, gives the loss, token accuracy, gradients and gradient norm of one plain process computing the
whole global batch at once (sp=1 on one rank), with the micro-batches planned for the group (one, and several
within a token budget). A short `accel-sft --preset cpu-demo` run at sp=2 trains: its loss falls.
"""

import json

import pytest
from conftest import run_python
from distributed import run_ranks
from pool_commands import run_command

from engine.offline.objectives.sft.cli import main

pytestmark = pytest.mark.slow

VARIANTS = {"packed, 1 micro-batch": 4096, "packed, 96-token budget": 96}


def _exactness(rank: int, model_dir: str) -> dict:
    import torch
    from sft_reference import full_grads, grad_norm, reference, relative_error

    import accel_backends
    from engine import EngineConfig, FSDPEngine
    from engine.offline.objectives.sft.batches import rank_micro_batches
    from engine.offline.objectives.sft.trainer import token_loss

    ref = reference(model_dir, 12)  # one plain process, the whole global batch in one padded forward
    items, cpu = ref.items, torch.device("cpu")

    from engine import output_layer
    output_layer.ROWS_PER_CHUNK = 16  # several checkpointed logit chunks per slice
    engine = FSDPEngine(model_dir, EngineConfig(fsdp_version=2, sequence_parallel_size=2, max_grad_norm=1e9, lr=1e-30),
                        accel_backends.get_backend())
    sp = engine.sequence_parallel
    results = {"sp_size": sp.size, "data_parallel_size": sp.data_parallel_size,
               "reference_tokens": ref.tokens}
    for name, budget in VARIANTS.items():
        micro, figures = rank_micro_batches(items, sp.data_parallel_rank, sp.data_parallel_size,
                                            micro_batch_tokens=budget, micro_batch_size=16, packed=True)
        with engine.train_mode():
            metrics = engine.forward_backward_batch(micro, lambda module, m: token_loss(module, m, cpu, sp))
            grads = full_grads(engine.module)
            norm = engine.optimizer_step()  # the norm, unclipped; lr 1e-30 leaves every fp32 weight as it was
        results[name] = {"micro_batches": figures["micro_batches"], "num_tokens": metrics["weight"],
                         "loss_error": abs(metrics["loss"] - ref.loss) / ref.loss,
                         "accuracy_error": abs(metrics["mean_token_accuracy"] - ref.accuracy),
                         "grad_error": relative_error(grads, ref.grads),
                         "grad_norm_error": abs(float(norm) - grad_norm(ref.grads)) / grad_norm(ref.grads)}
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from engine.demo_model import make_tiny_model

    model_dir = make_tiny_model(tmp_path_factory.mktemp("sft-sp") / "tiny", vocab_size=512)
    return run_ranks(_exactness, str(model_dir), world_size=2)


def test_the_two_ranks_form_one_group(results):
    for result in results:
        assert (result["sp_size"], result["data_parallel_size"]) == (2, 1)


@pytest.mark.parametrize("name", VARIANTS)
def test_loss_and_grad_norm_equal_one_rank_without_a_split(results, name):
    for result in results:
        got = result[name]
        assert got["num_tokens"] == result["reference_tokens"], (name, got)  # each supervised token counted once
        assert got["loss_error"] <= 1e-5, (name, got)
        assert got["grad_norm_error"] <= 1e-5, (name, got)
        assert got["grad_error"] <= 1e-5, (name, got)
        assert got["accuracy_error"] <= 1e-6, (name, got)
    assert results[0]["packed, 96-token budget"]["micro_batches"] > 1


def _command(*args):
    return run_python(["-m", "engine.offline.objectives.sft.cli", *args],
                      env={"ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1"},
                      timeout=600)


def test_a_short_demo_run_at_sp_2_learns_and_evaluates_as_it_validated(tmp_path, monkeypatch):
    result = run_command("sft", ["--preset", "cpu-demo", "engine.sequence_parallel_size=2", "train.steps=12",
                                 "engine.warmup_steps=2", "run.val_every=6", "run.save_every=12",
                                 "data.demo_examples=256", "run.progress=false", "run.name=sp2",
                                 f"run.output_dir={tmp_path}"], timeout=600)  # on the warm rank pool's 2 ranks
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "sp2"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    assert json.loads((run_dir / "config.json").read_text())["engine"]["sequence_parallel_size"] == 2
    last_val = [row["val/loss"] for row in rows if "val/loss" in row][-1]
    # The checkpoint two ranks of one group wrote, evaluated on slices (sp=2, from config.json: 2 processes) and
    # whole (sp=1, one process: this one): both give the run's own last validation loss. The eval on slices starts
    # its own 2 processes (eval refuses a checkpoint under torchrun, so the pool cannot run it).
    evaluated = _command("eval", str(run_dir))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    on_slices = json.loads(evaluated.stdout[evaluated.stdout.index("{"):])
    monkeypatch.setenv("ACCEL_BACKEND", "cpu")
    with pytest.warns(UserWarning, match="checkpoint was written by 2 ranks, this job has 1"):
        assert main(["eval", str(run_dir), "--nproc", "1", "engine.sequence_parallel_size=1",
                     f"--json={tmp_path / 'whole.json'}"]) == 0
    whole = json.loads((tmp_path / "whole.json").read_text())
    for figures in (on_slices, whole):
        assert figures["val/loss"] == pytest.approx(last_val, rel=1e-5), figures
