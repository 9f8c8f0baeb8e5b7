"""Fewer host reads per step (issue 46): the host reads device values a constant number of times per update, not
once or more per micro-batch or per attention layer (``accel_backends/testing/host_reads.py`` counts them)."""

import functools

import pytest
import torch

import accel_backends
from accel_backends.testing.host_reads import count_host_reads
from engine import EngineConfig, FSDPEngine
from engine.packing import SequenceBatch, build_layout, register_packed_sdpa
from engine.rl.batches import Batching, StepData, plan_updates
from engine.rl.logprobs import planned_log_probs
from engine.rl.rollout_correction import MismatchStats
from engine.rl.terms import Norm, entropy_bonus, kl_to, policy_gradient
from engine.rl.update import Correction, policy_loss_of
from engine.tiny_model import tiny_qwen2

SEQUENCES = 8
PROMPTS, RESPONSES = (3, 5, 2, 4, 6, 3, 2, 5), (6, 2, 9, 4, 3, 7, 5, 8)


class _Rollout:
    temperature, top_k, top_p = 1.0, 0, 1.0


def _step_data(micro_batches: int) -> StepData:
    """Eight packed sequences with old, reference and rollout-engine log-probs, cut into ``micro_batches``."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 97, (n,), generator=g) for n in PROMPTS]
    responses = [torch.randint(0, 97, (n,), generator=g) for n in RESPONSES]
    sequences = SequenceBatch.from_parts(prompts, responses)
    width = max(RESPONSES)
    mask = (torch.arange(width) < torch.tensor(RESPONSES).unsqueeze(1)).long()
    batching = Batching(SEQUENCES, 2, None, SEQUENCES // micro_batches, packed=True)
    return StepData(sequences, mask, torch.randn(SEQUENCES, generator=g), plan_updates(sequences, batching, 1), 0,
                    True, old_log_probs=-torch.rand(SEQUENCES, width, generator=g),
                    sampling_log_probs=-torch.rand(SEQUENCES, width, generator=g),
                    frozen_log_probs={"ref": -torch.rand(SEQUENCES, width, generator=g)})


def _update_reads(backend, micro_batches: int, layers: int):
    """The reads of an RL step's forward-only log-prob pass (the old or reference model's), then of one update's
    forward and backward (GRPO's terms: clipped policy gradient, KL to the reference, entropy bonus; rollout
    correction and its mismatch figures) over packed micro-batches with the mismatch figures read for the step's
    metrics."""
    engine = FSDPEngine(functools.partial(tiny_qwen2, seed=0, vocab_size=97, hidden_size=32, layers=layers,
                                          max_positions=64), EngineConfig(fsdp_version=2, mixed_precision="fp32"),
                        backend=backend)
    norm = Norm("token-mean")
    terms = [policy_gradient(norm), kl_to("ref", 0.1, norm), entropy_bonus(0.01, norm)]
    loss_fn = functools.partial(policy_loss_of, terms=terms, rollout=_Rollout, correction=Correction("token_truncate",
                                2.0), sp=engine.sequence_parallel, device=backend.device())
    data = _step_data(micro_batches)
    layouts = list(data.rank_layouts())  # planned on the host (on a device no read), outside the counted block
    data.rank_layouts = lambda: iter(layouts)
    with engine.eval_mode(), count_host_reads(backend) as log_prob_reads:
        old = planned_log_probs(engine, data, 1.0, "old")
    assert old.shape == data.loss_mask.shape and bool(old[data.loss_mask.bool()].lt(0).all())
    micro = data.micro_batches(data.mini_batches[0], record_mismatch=True)  # on the host, before the update
    assert len(micro) == micro_batches
    with engine.train_mode():
        with count_host_reads(backend) as reads:
            metrics = engine.forward_backward_batch(micro, loss_fn)
            mismatch = MismatchStats.total(m.mismatch for m in micro)  # each micro-batch's own, added on the device
            mismatch.sums(), mismatch.maxima()
        engine.optimizer_step()
    assert {"pg_loss", "kl", "entropy", "clip_frac", "approx_kl"} <= set(metrics)
    reads.log_prob_pass = log_prob_reads
    return reads


@pytest.fixture(scope="module")
def strict():
    torch.set_num_threads(1)
    backend = accel_backends.get_backend("strict")
    backend.init_distributed()
    yield backend
    torch.distributed.destroy_process_group()  # later in-process tests must not see a group left behind


def test_an_updates_host_reads_do_not_grow_with_micro_batches_or_layers(strict):
    counts = {(micro, layers): _update_reads(strict, micro, layers) for micro, layers in ((2, 2), (4, 2), (2, 4))}
    places = {key: dict(reads.where) for key, reads in counts.items()}
    assert len({reads.count for reads in counts.values()}) == 1, places
    # The loss terms, the rollout correction and packed attention read nothing per micro-batch or layer: what is
    # left is the step's one metric reduction and the mismatch figures read once.
    per_micro_batch = [where for where in places[(4, 2)] if "engine/rl/" in where and "rollout_correction" not in where
                       or "engine/packing/" in where]
    assert not per_micro_batch, places[(4, 2)]
    assert counts[(4, 2)].count <= 12, places[(4, 2)]
    # The old / reference log-prob pass fills its rows on the device and copies them to the host once.
    passes = {key: reads.log_prob_pass for key, reads in counts.items()}
    assert {reads.count for reads in passes.values()} == {1}, {key: dict(r.where) for key, r in passes.items()}


def test_packed_attention_takes_the_rows_starts_from_the_host():
    """A packed row's forward through packed_sdpa reads nothing back: the starts come tagged from build_layout;
    an untagged row (positions alone) is read once per attention layer."""
    model = tiny_qwen2(seed=0, vocab_size=97, hidden_size=32, layers=3, max_positions=64,
                       attn_implementation=register_packed_sdpa())
    g = torch.Generator().manual_seed(1)
    batch = SequenceBatch.from_parts([torch.randint(0, 97, (n,), generator=g) for n in (3, 4, 2)],
                                     [torch.randint(0, 97, (n,), generator=g) for n in (5, 2, 7)])
    layout = build_layout(batch, [0, 1, 2], packed=True)
    assert layout.row_starts == (0, 8, 14)
    host = accel_backends.get_backend("cpu")
    with torch.no_grad(), count_host_reads(host) as tagged:
        want = model(**layout.inputs, use_cache=False).logits
    untagged_inputs = {**layout.inputs, "position_ids": layout.inputs["position_ids"].clone()}  # no tag
    with torch.no_grad(), count_host_reads(host) as untagged:
        got = model(**untagged_inputs, use_cache=False).logits
    assert torch.equal(got, want)
    assert tagged.count == 0, dict(tagged.where)
    assert untagged.count >= 3, dict(untagged.where)  # one per layer at least


def test_the_counter_counts_what_reads_device_values():
    host = accel_backends.get_backend("cpu")
    x = torch.tensor([1.0, 2.0, 3.0])
    with count_host_reads(host) as reads:
        x.sum().item(), x.tolist(), float(x[0]), int(x[1]), bool(x.any()), x.nonzero()
        x[x > 1.5], torch.repeat_interleave(torch.tensor([1, 2])), x.cpu()
        y = x * 2 + 1  # arithmetic: queued on the device, nothing read
        y.sum(), x.repeat_interleave(2)
    assert reads.count == 9, dict(reads.where)
    assert all("test_host_reads.py:" in where for where in reads.where)

    class OnADevice(accel_backends.DeviceBackend):  # reads of its device's tensors count, the host's do not
        device_type = "meta"

    with count_host_reads(OnADevice()) as reads:
        x.sum().item(), torch.ones(2, device="meta").sum()
    assert reads.count == 0
