"""Packed micro-batches on real gloo ranks with the GRPO trainer: the same gradients as padded ones in every loss
mode (FSDP1, FSDP2, LoRA with a KL reference), ranks holding different numbers of sequences, a sequence that alone
fills the token budget; the fallback for an attention that cannot take packed input; and the same updates on 1 and
2 ranks from the same settings. One 2-rank job and one 1-rank job (module fixtures, as a spawn costs seconds of
imports); each test asserts one property of their results, so that one failure does not hide the others."""

from pathlib import Path

import pytest
import torch
from distributed import run_ranks

pytestmark = pytest.mark.slow

BASE = ["train.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=6", "rollout.temperature=0.9",
        "algorithm.kl_coef=0", "run.progress=false", "engine.lr=1e-3"]
MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean")
BUDGET = 24  # tokens per micro-batch per rank; sequence 1 of rank 0 has exactly this many
VOCAB = 20  # the built-in model's character vocabulary is larger


def _local_sequences(rank: int, world_size: int = 2, total: int = 8) -> dict:
    """This rank's share of a fixed global batch, uneven on purpose: 5 and 3 sequences on 2 ranks (a filter kept
    more groups on one), all of it on 1 rank."""
    g = torch.Generator().manual_seed(11)
    prompts = torch.randint(2, 7, (total,), generator=g)
    responses = torch.randint(1, 17, (total,), generator=g)
    prompts[1], responses[1] = 6, BUDGET - 6  # fills the budget alone
    tokens = torch.randint(1, VOCAB, (total, BUDGET), generator=g)
    loss_mask = (torch.arange(BUDGET).unsqueeze(0) < responses.unsqueeze(1)).long()
    loss_mask[3, : int(responses[3]) // 2] = 0  # tokens left out of the loss (as truncated responses would be)
    advantages = torch.randn(total, generator=g)
    split = [total * 5 // 8, total * 3 // 8] if world_size == 2 else [total]
    start = sum(split[:rank])
    rows = slice(start, start + split[rank])
    lengths = prompts + responses
    width = int(lengths[rows].max())
    return {"tokens": tokens[rows, :width].clone(), "lengths": lengths[rows].clone(), "starts": prompts[rows].clone(),
            "loss_mask": loss_mask[rows, : int(responses[rows].max())].clone(), "advantages": advantages[rows].clone()}


def _trainer(tmp, *overrides):
    from engine.rl.algorithms.grpo.config import build_config
    from engine.train.registry import get_recipe

    return get_recipe("grpo").trainer_of(build_config(None, None, [*BASE, *overrides]), Path(tmp), resume=False)


def _full_grads(module):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(module, FSDP):
        with FSDP.summon_full_params(module, with_grads=True):
            return [p.grad.clone() for p in module.parameters() if p.grad is not None]
    return [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for p in module.parameters() if p.grad is not None]


def _step_data(trainer, local, packed, rank, world_size, mini_batch_sequences=8, budget=None):
    """Packed micro-batches within the budget, or padded ones of 2 sequences (or within ``budget``, padded)."""
    from engine.rl.batches import Batching, gather_step_data

    budget = BUDGET if packed else budget
    batching = Batching(mini_batch_sequences, 4, budget, 2, packed)
    return gather_step_data(local, batching, rank, world_size, torch.device("cpu"))


def _gradients_packed_and_padded(trainer, rank):
    """Gradients of every loss mode: packed within the budget; padded 2 sequences at a time (another split) and
    padded within the budget (rows x longest, ``train.padding_free=false`` with a budget)."""
    grads, plans = {}, {}
    for variant, packed, budget in (("packed", True, None), ("padded", False, None),
                                    ("padded_budget", False, BUDGET)):
        data = _step_data(trainer, _local_sequences(rank), packed, rank, 2, budget=budget)
        if trainer.config.algorithm.kl_coef > 0:
            data.ref_log_probs = trainer.reference_log_probs(data)
        (mini,) = data.mini_batches
        plans[variant] = mini.plan
        for mode in MODES:
            trainer.config.algorithm.loss_agg = mode
            trainer.reconfigure()  # the loss terms are built once
            with trainer.actor.train_mode():
                trainer.actor.forward_backward_batch(data.micro_batches(mini), trainer.loss_fn)
                grads[variant, mode] = _full_grads(trainer.actor.module)
                trainer.actor.zero_grad()
    worst = {}
    for mode in MODES:
        for variant in ("padded", "padded_budget"):
            got, want = grads["packed", mode], grads[variant, mode]
            scale = max(w.abs().max().item() for w in want)
            error = max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) / scale
            worst[mode] = max(worst.get(mode, 0.0), error)
    return worst, plans, data


def _record_updates(trainer):
    """Wrap the actor's forward_backward_batch to keep each update's loss and micro-batch count."""
    seen = []
    original = trainer.actor.forward_backward_batch

    def recorded(micro_batches, step_fn, forward_only=False):
        metrics = original(micro_batches, step_fn, forward_only)
        seen.append((metrics["loss"], metrics["micro_batches"]))
        return metrics

    trainer.actor.forward_backward_batch = recorded
    return seen


def _same_updates(trainer, rank, world_size):
    """Two updates of 8 sequences each (prompts_per_update=2 of 4 prompts) from the same global batch."""
    local = _local_sequences(rank, world_size, total=16)
    data = _step_data(trainer, local, True, rank, world_size, mini_batch_sequences=8)
    seen = _record_updates(trainer)
    metrics = trainer.update(data)
    return {"updates": metrics["updates"], "losses": [loss for loss, _ in seen], "grad_norm": metrics["grad_norm"],
            "micro_batches": [count for _, count in seen]}


def _two_ranks(rank, tmp):
    import warnings

    import torch.distributed as dist
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out = {}
    # -- the exchange: every rank holds the same global batch, rank 0's rows first ---------------------------------
    trainer = _trainer(tmp, "engine.fsdp_version=2")
    data = _step_data(trainer, _local_sequences(rank), True, rank, 2)
    out["global_tokens"] = data.sequences.tokens.tolist()
    out["global_lengths"] = data.sequences.lengths.tolist()

    # -- gradient parity, packed against padded, FSDP1 / FSDP2 / LoRA with a KL reference -----------------------
    out["parity"], out["plans"] = {}, {}
    for name, overrides in (("fsdp2", []), ("fsdp1", ["engine.fsdp_version=1"]),
                            ("lora", ["engine.lora_rank=4", "algorithm.kl_coef=0.05"])):
        variant = trainer if name == "fsdp2" else _trainer(tmp, *overrides)
        out[f"{name}_packed"] = variant.packed
        if name == "lora":
            for param_name, param in variant.actor.module.named_parameters():
                if "lora_B" in param_name:  # non-zero adapters: both LoRA matrices get gradients, the KL is not 0
                    with torch.no_grad():
                        local = param.to_local() if hasattr(param, "to_local") else param
                        local.normal_(std=0.3, generator=torch.Generator().manual_seed(5))
        worst, plans, _ = _gradients_packed_and_padded(variant, rank)
        out["parity"][name] = worst
        out["plans"][name] = {variant: (plan.ranks, plan.imbalance, plan.loads) for variant, plan in plans.items()}
        if name == "lora":
            # A real step end to end (rollout, exchange, reference pass, update): the path and pad counts.
            step_data, _, _ = variant.collect(step=0)
            variant.update(step_data)
            out["lora_step"] = variant.packing_metrics(step_data)

    # -- an attention that ignores the packing: one warning, padded micro-batches, right log-probs ---------------
    def whole_row_causal(module, query, key, value, attention_mask, **kwargs):
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)

    AttentionInterface.register("test_whole_row_causal", whole_row_causal)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = _trainer(tmp, "engine.attn_implementation=test_whole_row_causal")
    out["fallback_warnings"] = [str(w.message) for w in caught if "packed" in str(w.message)]
    out["fallback_packed"] = fallback.packed
    out["fallback_attention"] = fallback.actor.attn_implementation
    from engine.rl.logprobs import planned_log_probs

    padded = _step_data(fallback, _local_sequences(rank), False, rank, 2)
    with fallback.actor.eval_mode():
        got = planned_log_probs(fallback.actor, padded, 1.0, "old")
    with trainer.actor.eval_mode():  # the same initial weights with sdpa, packed
        want = planned_log_probs(trainer.actor, _step_data(trainer, _local_sequences(rank), True, rank, 2), 1.0, "old")
    mine = [i for micro in padded.mini_batches[0].plan.ranks[rank] for i in micro]
    theirs = [i for micro in _step_data(trainer, _local_sequences(rank), True, rank, 2).mini_batches[0].plan.ranks[rank]
              for i in micro]
    both = sorted(set(mine) & set(theirs))  # rows each rank computed on both paths (the plans differ)
    out["fallback_vs_sdpa"] = (got[both] - want[both]).abs().max().item() if both else 0.0
    out["fallback_rows_compared"] = len(both)
    step_data, _, _ = fallback.collect(step=0)  # a real step runs on the fallback (its responses may be equal length)
    fallback.update(step_data)
    out["fallback_step"] = fallback.packing_metrics(step_data)
    fallback.update(padded)  # uneven lengths: the padded micro-batches compute pad tokens, counted
    out["fallback_uneven"] = fallback.packing_metrics(padded)

    # -- world-size-free updates (compared with the 1-rank job) -------------------------------------------------
    trainer.config.algorithm.loss_agg = "token-mean"  # as the 1-rank trainer (the parity loop left the last mode)
    trainer.reconfigure()  # the loss terms are built once
    out["updates"] = _same_updates(trainer, rank, dist.get_world_size())
    return out


def _one_rank(rank, tmp):
    return _same_updates(_trainer(tmp, "engine.fsdp_version=2"), rank, 1)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Both ranks' results of the 2-rank job; each test below checks one property of them."""
    return run_ranks(_two_ranks, str(tmp_path_factory.mktemp("packing") / "two"))


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The 1-rank job's updates from the same settings."""
    return run_ranks(_one_rank, str(tmp_path_factory.mktemp("packing") / "one"), world_size=1)[0]


def test_the_exchange_gives_every_rank_the_whole_batch(two):
    # The exchange: both ranks hold rank 0's 5 sequences then rank 1's 3, as the 1-rank view has them.
    whole = _local_sequences(0, world_size=1)
    for out in two:
        assert out["global_lengths"] == whole["lengths"].tolist()
        for row, length in enumerate(out["global_lengths"]):
            assert out["global_tokens"][row][:length] == whole["tokens"][row, :length].tolist()


def test_packed_gradients_equal_padded_ones_in_every_mode(two):
    for rank, out in enumerate(two):
        for name, worst in out["parity"].items():
            assert out[f"{name}_packed"], name
            for mode, error in worst.items():
                assert error <= 1e-5, (rank, name, mode, error)
    print("packed vs padded, max relative gradient difference:", two[0]["parity"])


def test_micro_batch_plans_keep_the_token_budget(two):
    for out in two:
        packed_plan, imbalance, _ = out["plans"]["fsdp2"]["packed"]
        assert len(packed_plan[0]) == len(packed_plan[1]) and imbalance >= 1.0  # same count on both ranks
        assert (1,) in [micro for ranks in packed_plan for micro in ranks]  # the 24-token sequence runs alone
        padded_plan, _, _ = out["plans"]["fsdp2"]["padded_budget"]
        lengths = out["global_lengths"]
        for micro in (m for ranks in padded_plan for m in ranks if m):  # rows x longest within the budget
            assert len(micro) * max(lengths[i] for i in micro) <= BUDGET


def test_a_packed_lora_step_has_no_pad_tokens(two):
    for out in two:
        step = out["lora_step"]
        assert step["packed"] == 1.0 and step["pad_tokens_update"] == 0 and step["pad_tokens_ref"] == 0, step
        assert step["micro_batches"] >= 1 and step["token_imbalance"] >= 1.0


def test_an_attention_without_packed_input_falls_back_to_padding_once_said(two):
    # The fallback: taken, said once (rank 0), padded micro-batches that compute the right log-probs.
    for rank, out in enumerate(two):
        assert not out["fallback_packed"] and out["fallback_attention"] == "test_whole_row_causal"
        assert len(out["fallback_warnings"]) == (1 if rank == 0 else 0), out["fallback_warnings"]
        if rank == 0:
            assert "cannot take packed sequences" in out["fallback_warnings"][0]
        assert out["fallback_step"]["packed"] == 0.0 and out["fallback_uneven"]["packed"] == 0.0
        assert out["fallback_uneven"]["pad_tokens_update"] > 0 and out["fallback_uneven"]["pad_tokens_old"] > 0
        assert out["fallback_vs_sdpa"] < 1e-5 and sum(o["fallback_rows_compared"] for o in two) > 0


def test_updates_do_not_depend_on_the_world_size(two, one):
    # The same settings on 1 and 2 ranks: the same number of updates, the same losses.
    for out in two:
        updates = out["updates"]
        assert updates["updates"] == one["updates"] == 2.0
        assert updates["losses"] == pytest.approx(one["losses"], rel=1e-4, abs=1e-6), (updates, one)
        assert updates["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
