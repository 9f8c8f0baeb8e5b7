"""The SFT loss is exact over the global batch: on 2 real gloo ranks (FSDP2, deferred gradient sync), packed in one
micro-batch per rank, packed within a small token budget, and padded one sequence per micro-batch (8 per rank),
the loss and every gradient equal those of one plain process computing the whole batch at once (sum over the
supervised tokens / their count), the ranks' logits computed in chunks of 16 positions and the reference's in one;
and packed sequences never attend to each other. One spawn (a module fixture); each test asserts one property of
its results."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow

VARIANTS = {"packed, 1 micro-batch": {"micro_batch_tokens": 4096, "packed": True},
            "packed, 96-token budget": {"micro_batch_tokens": 96, "packed": True},
            "padded, 8 micro-batches": {"micro_batch_tokens": None, "micro_batch_size": 1, "packed": False}}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from engine.demo_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("sft-model") / "tiny", vocab_size=512)


def _exactness(rank: int, model_dir: str) -> dict:
    import torch
    from sft_reference import full_grads, reference, relative_error, tokenized

    import accel_backends
    from engine import EngineConfig, FSDPEngine
    from engine.offline.objectives.sft.batches import rank_micro_batches
    from engine.offline.objectives.sft.trainer import token_loss
    from engine.offline.sequences import sequence_batch
    from engine.packing import build_layout

    ref = reference(model_dir, 16)  # one plain process, the whole global batch in one padded forward
    items, cpu = ref.items, torch.device("cpu")

    # Packed sequences do not see each other: change sequence 1, sequences 0 and 2 keep their logits.
    def packed_logits(chosen):
        packed = build_layout(sequence_batch(chosen)[0], [0, 1, 2], packed=True)  # in this order, one row
        assert packed.inputs["input_ids"].shape[0] == 1 and "attention_mask" not in packed.inputs
        with torch.no_grad():
            out = ref.model(**packed.inputs, logits_to_keep=packed.logits_to_keep, use_cache=False)
        return packed.select(out.logits), packed.rows

    trio = items[:3]
    changed = tokenized(ref.tokenizer, 4, "t:changed")
    assert len(changed.ids) != len(trio[1].ids) or changed.ids != trio[1].ids
    before, rows_before = packed_logits(trio)
    after, rows_after = packed_logits([trio[0], changed, trio[2]])
    others_moved = max(float((before[rows_before == r] - after[rows_after == r]).abs().max()) for r in (0, 2))

    from engine import output_layer
    output_layer.ROWS_PER_CHUNK = 16  # the engine runs several checkpointed logit chunks; the reference, one
    backend = accel_backends.get_backend()
    engine = FSDPEngine(model_dir, EngineConfig(fsdp_version=2, grad_sync="deferred"), backend)
    results = {"others_moved": others_moved, "grad_sync": engine.grad_sync_mode,
               "reference_loss": ref.loss, "reference_tokens": ref.tokens}
    for name, options in VARIANTS.items():
        micro, figures = rank_micro_batches(items, rank, engine.world_size, **{"micro_batch_size": 16, **options})
        with engine.train_mode():
            metrics = engine.forward_backward_batch(micro, lambda module, m: token_loss(module, m, cpu))
            grads = full_grads(engine.module)
            engine.zero_grad()
        results[name] = {"micro_batches": figures["micro_batches"], "num_tokens": metrics["weight"],
                         "loss_error": abs(metrics["loss"] - ref.loss) / ref.loss,
                         "accuracy_error": abs(metrics["mean_token_accuracy"] - ref.accuracy),
                         "grad_error": relative_error(grads, ref.grads)}
    return results


@pytest.fixture(scope="module")
def results(tiny_model_dir):
    """Both ranks' results of the one spawn; each test below checks one property of them."""
    return run_ranks(_exactness, str(tiny_model_dir), world_size=2)


def test_the_gradient_sync_is_deferred(results):
    for result in results:
        assert result["grad_sync"] == "deferred"


def test_packed_sequences_do_not_attend_to_each_other(results):
    for result in results:
        assert result["others_moved"] < 1e-5, result["others_moved"]


def test_each_way_of_splitting_makes_its_micro_batches(results):
    for result in results:
        assert result["packed, 1 micro-batch"]["micro_batches"] == 1
        assert result["packed, 96-token budget"]["micro_batches"] > 1
        assert result["padded, 8 micro-batches"]["micro_batches"] == 8


@pytest.mark.parametrize("name", VARIANTS)
def test_loss_and_gradients_are_exact_however_the_global_batch_is_split(results, name):
    for result in results:
        got = result[name]
        assert got["num_tokens"] == result["reference_tokens"], name  # supervised tokens over both ranks
        assert got["loss_error"] <= 1e-5, (name, got)
        assert got["grad_error"] <= 1e-5, (name, got)
        assert got["accuracy_error"] <= 1e-6, (name, got)
