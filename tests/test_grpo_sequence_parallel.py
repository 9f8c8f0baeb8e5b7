"""accel-grpo with sequence parallelism (engine.sequence_parallel_size=2, issue 30), on real gloo ranks.

Exactness: one sp group of 2 ranks (FSDP2, fp32) running GRPO's own passes on slices -- the old/ref log-prob pass
(``planned_log_probs``) and the trainer's ``loss_fn`` through ``forward_backward_batch`` -- gives the log-probs,
loss, metrics, rollout-mismatch figures and gradient norm of one plain process computing the whole step at once,
for the same global batch. Qwen2 with 2 key/value heads (grouped-query attention), packed within a token budget
(several micro-batches) and padded; DAPO's token-mean PPO-clip loss with a KL term, an entropy bonus and the token
rollout correction; GSPO (its sequence ratio summed over the group) with the sequence rollout correction; Dr.
GRPO with LoRA. One fixture run, checked several ways. A short ``--preset cpu-demo`` run at sp=2 learns.
"""

import json

import pytest
from distributed import run_ranks
from pool_commands import run_command

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # relative error of loss and gradient norm, fp32
VARIANTS = {  # name: (packed, micro-batch token budget, LoRA, algorithm settings)
    "dapo-packed-kl-entropy": (True, 40, False, {"loss_type": "dapo", "kl_loss_coef": 0.1, "entropy_coeff": 0.01}),
    "gspo-padded-sequence-correction": (False, None, False, {"loss_type": "gspo", "clip_low": 0.2,
                                                             "clip_high": 0.2,
                                                             "rollout_correction": "sequence_truncate"}),
    "dr_grpo-lora-packed": (True, 40, True, {"loss_type": "dr_grpo", "kl_loss_coef": 0.05}),
    # a narrow band: some sequences' geometric-mean ratio leaves it (their mean log-ratio summed over the group)
    "grpo-packed-seq-geo-mask": (True, 40, False, {"rollout_correction": "seq_geo_mask",
                                                   "rollout_correction_cap": 1.03}),
}
PROMPTS, RESPONSES = [3, 8, 5, 4, 7, 6, 3, 9], [6, 2, 11, 14, 5, 9, 13, 4]  # tokens of the step's 8 sequences


def _step_data(packed: bool, budget):
    """The step's sequences as ``StepData`` planned for one data-parallel group (the same micro-batches for one
    process and for a group of two), with advantages and a loss mask that leaves two response tokens out."""
    import torch

    from engine.packing import SequenceBatch
    from engine.rl.batches import Batching, StepData, plan_updates

    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, 96, (n,), generator=g) for n in PROMPTS]
    responses = [torch.randint(1, 96, (n,), generator=g) for n in RESPONSES]
    sequences = SequenceBatch.from_parts(prompts, responses)
    mask = (torch.arange(max(RESPONSES)) < torch.tensor(RESPONSES).unsqueeze(1)).long()
    mask[2, 4] = mask[5, 0] = 0  # tool output: attended, never trained on
    advantages = torch.randn(len(PROMPTS), generator=g)
    batching = Batching(len(PROMPTS), 4, budget, 3, packed)  # padded: 3 sequences per micro-batch
    return StepData(sequences, mask, advantages, plan_updates(sequences, batching, 1), 0, packed)


def _trainer(config, sp, backend, module=None):
    """What ``RLTrainer.loss_fn`` reads of its trainer, and the engine ``planned_log_probs`` reads."""
    import contextlib
    import types

    from engine.rl.algorithms.grpo.algorithm import GRPOAlgorithm
    from engine.rl.update import Correction

    return types.SimpleNamespace(terms=GRPOAlgorithm(config).terms(), correction=Correction.of(config.algorithm),
                                 backend=backend, config=config,
                                 actor=types.SimpleNamespace(sequence_parallel=sp), sequence_parallel=sp,
                                 module=module, generation_model=lambda: contextlib.nullcontext(module))


def _grad_norm(module) -> float:
    return sum(float(p.grad.double().norm() ** 2) for p in module.parameters() if p.grad is not None) ** 0.5


def _perturbed(data, log_probs, g):
    """Old, reference and rollout-engine log-probs near the policy's, so every term has a value and a gradient."""
    import torch

    def near(scale):
        return (log_probs + scale * torch.randn(log_probs.shape, generator=g)) * data.loss_mask

    data.old_log_probs, data.ref_log_probs, data.sampling_log_probs = near(0.05), near(0.2), near(0.1)


def _exactness(rank: int) -> dict:
    import functools

    import sp_cases
    import torch

    import accel_backends
    from engine import EngineConfig, FSDPEngine, output_layer
    from engine.rl.algorithms.grpo.schema import AlgorithmConfig, GRPOConfig
    from engine.rl.logprobs import planned_log_probs
    from engine.rl.rollout_correction import MismatchStats
    from engine.rl.step import RLTrainer
    from engine.runtime import sum_over_ranks
    from engine.sequence_parallel import SequenceParallel

    output_layer.ROWS_PER_CHUNK = 4  # several checkpointed logit chunks per slice
    backend = accel_backends.get_backend()
    single = SequenceParallel.single(0, 1)
    results = {}
    for name, (packed, budget, lora, algorithm) in VARIANTS.items():
        config = GRPOConfig(algorithm=AlgorithmConfig(**algorithm))
        config.rollout.temperature = 0.7
        reference = sp_cases.build_model("qwen2", 2, lora)
        whole = _step_data(packed, budget)
        with torch.no_grad():
            ref_log_probs = planned_log_probs(_trainer(config, single, backend, reference), whole, 0.7, "old")
        _perturbed(whole, ref_log_probs, torch.Generator().manual_seed(5))
        # sp=1 on one process, as forward_backward_batch weighs the micro-batches: their weighted mean
        plain, whole_micro = _trainer(config, single, backend), whole.micro_batches(whole.mini_batches[0], True)
        outputs = [RLTrainer.loss_fn(plain, reference, m) for m in whole_micro]
        reference_mismatch = MismatchStats.total(m.mismatch for m in whole_micro)
        ref_weight = sum(float(w) for _, w, _ in outputs)
        ref_loss = sum(loss * float(w) for loss, w, _ in outputs) / ref_weight
        ref_metrics = {k: sum(m[k] * float(w) for _, w, m in outputs) / ref_weight for k in outputs[0][2]}
        ref_loss.backward()
        ref_norm = _grad_norm(reference)

        engine = FSDPEngine(functools.partial(sp_cases.build_model, "qwen2", 2, lora),
                            EngineConfig(fsdp_version=2, sequence_parallel_size=2, max_grad_norm=1e9, lr=1e-30),
                            backend)
        sp = engine.sequence_parallel
        data = _step_data(packed, budget)
        with engine.eval_mode():
            log_probs = planned_log_probs(engine, data, 0.7, "old")
        for field in ("old_log_probs", "ref_log_probs", "sampling_log_probs"):
            setattr(data, field, getattr(whole, field))
        trainer = _trainer(config, sp, backend)
        trainer.actor = engine
        with engine.train_mode():
            micro = data.micro_batches(data.mini_batches[0], record_mismatch=True)
            metrics = engine.forward_backward_batch(micro, functools.partial(RLTrainer.loss_fn, trainer))
            stats = MismatchStats.total(m.mismatch for m in micro)
            grad_norm = engine.optimizer_step()  # unclipped; lr 1e-30 leaves every fp32 weight as it was
        mismatch = sum_over_ranks(stats.sums(), backend.metrics_device())
        reference_mismatch = reference_mismatch.sums()
        keys = ("pg_loss", "clip_frac", "approx_kl", "entropy", "kl")
        results[name] = {
            "micro_batches": len(micro), "weight": metrics["weight"], "reference_weight": ref_weight,
            "log_prob_error": float((log_probs - ref_log_probs).abs().max()),
            "loss_error": abs(metrics["loss"] - ref_loss.item()) / abs(ref_loss.item()),
            "grad_norm_error": abs(float(grad_norm) - ref_norm) / ref_norm,
            "metric_errors": {k: abs(metrics[k] - ref_metrics[k]) for k in keys if k in ref_metrics},
            "mismatch_errors": {k: abs(mismatch[k] - reference_mismatch[k]) / max(abs(reference_mismatch[k]), 1.0)
                                for k in reference_mismatch},
            "mismatch_tokens": reference_mismatch["mismatch/tokens"],
            "masked_sequences": reference_mismatch["mismatch/masked_sequences"],
        }
    return results


@pytest.fixture(scope="module")
def results():
    return run_ranks(_exactness, world_size=2)


@pytest.mark.parametrize("name", VARIANTS)
def test_loss_and_grad_norm_equal_one_process_without_a_split(results, name):
    for result in results:
        got = result[name]
        assert got["weight"] == pytest.approx(got["reference_weight"]), got  # each token (sequence) counted once
        assert got["loss_error"] <= TOLERANCE, (name, got)
        assert got["grad_norm_error"] <= TOLERANCE, (name, got)
        assert got["log_prob_error"] <= 1e-5, (name, got)  # the old/ref pass: slices summed within the group
        assert all(error <= 1e-5 for error in got["metric_errors"].values()), (name, got)
        assert len(got["metric_errors"]) >= 4, got
    assert results[0][name]["micro_batches"] > 1  # several micro-batches (within the budget, or 3 sequences)


def test_rollout_mismatch_figures_count_each_token_and_sequence_once(results):
    for result in results:
        for name in ("dapo-packed-kl-entropy", "gspo-padded-sequence-correction", "grpo-packed-seq-geo-mask"):
            got = result[name]
            assert got["mismatch_tokens"] == sum(RESPONSES) - 2, got
            assert all(error <= 1e-5 for error in got["mismatch_errors"].values()), (name, str(got["mismatch_errors"]))
        assert 0 < result["grpo-packed-seq-geo-mask"]["masked_sequences"] < len(RESPONSES)  # the band masks some


def test_a_short_demo_run_at_sp_2_learns(tmp_path):
    """The cpu-demo echo task at sp=2 on 2 ranks (one group sampling 16 prompts a step): the reward rises."""
    result = run_command("grpo", ["--preset", "cpu-demo", "engine.sequence_parallel_size=2", "train.steps=20",
                                  "run.progress=false", "run.name=sp2", f"run.output_dir={tmp_path}"],
                         timeout=600)  # on the warm rank pool's 2 ranks
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "sp2"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward_mean"] for row in rows if "reward_mean" in row]
    assert len(rewards) == 20
    assert sum(rewards[-4:]) / 4 > 2 * sum(rewards[:4]) / 4, rewards  # seen: 0.032 -> 0.132
    assert json.loads((run_dir / "config.json").read_text())["engine"]["sequence_parallel_size"] == 2
    assert rows[-1]["micro_batches"] == 8  # 128 sequences in micro-batches of 16, planned for the one group
