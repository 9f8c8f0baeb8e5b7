"""Ulysses sequence parallelism is exact: sp=2 on 2 ranks gives the loss and gradient norm of sp=1 on one rank for
the same global batch (fp32), packed and padded, FSDP2 and FSDP1, LoRA, Qwen2, Llama and Qwen3, grouped-query
attention with fewer key/value heads than ranks included. Real gloo ranks, real HF models built from a config."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # relative error of loss and gradient norm, fp32
CASES = {  # name: (family, kv heads, lora, fsdp version, data)
    "qwen2-packed": ("qwen2", 2, False, 2, "packed"),
    "qwen2-padded": ("qwen2", 2, False, 2, "padded"),
    "qwen2-kv1-packed": ("qwen2", 1, False, 2, "packed"),
    "qwen2-left-padded-labels": ("qwen2", 2, False, 2, "plain"),
    "qwen2-lora-packed": ("qwen2", 2, True, 2, "packed"),
    "qwen2-fsdp1-packed": ("qwen2", 2, False, 1, "packed"),
    "llama-padded": ("llama", 4, False, 2, "padded"),
    "llama-one-sequence": ("llama", 2, False, 2, "single"),
    "qwen3-kv1-packed": ("qwen3", 1, False, 2, "packed"),
    "qwen3-checkpointed-padded": ("qwen3", 2, False, 2, "padded-checkpointed"),
    "qwen2-grpo-log-probs-packed": ("qwen2", 2, False, 2, "grpo"),  # the trainers' own chunked functions on slices
    "qwen2-sft-loss-padded": ("qwen2", 2, False, 2, "sft"),
}


def _measure(rank, names, sp_size, seeds=(7,)):
    """Loss and gradient norm of one update over the whole global batch, for each case; the exchanges counted.

    ``seeds``: the data of each data-parallel group (one group's micro-batches per seed); a run with fewer groups
    than seeds (the one-rank reference) takes them all.
    """
    import functools

    import sp_cases
    from sp_cases import ONE_SEQUENCE, CountingBackend, build_model, layout_loss, layouts, plain_batches, plain_loss

    from engine import EngineConfig, FSDPEngine

    results = {}
    for name in names:
        family, kv_heads, lora, fsdp_version, data = CASES[name]
        config = EngineConfig(fsdp_version=fsdp_version, sequence_parallel_size=sp_size, max_grad_norm=None,
                              grad_sync="deferred", wrap_single_rank=True,
                              gradient_checkpointing=data.endswith("checkpointed"))
        backend = CountingBackend()
        engine = FSDPEngine(functools.partial(build_model, family, kv_heads, lora), config, backend=backend)
        sp = engine.sequence_parallel
        groups = sp.data_parallel_size
        mine = seeds if groups == 1 else seeds[sp.data_parallel_rank::groups]
        if data == "plain":
            batches, step = [b for s in mine for b in plain_batches(s)], plain_loss
        elif data == "single":
            batches, step = [b for s in mine for b in layouts(True, s, ONE_SEQUENCE)], layout_loss
        elif data in ("grpo", "sft"):
            step = sp_cases.grpo_log_prob_loss if data == "grpo" else sp_cases.sft_token_loss
            batches = [b for s in mine for b in layouts(data == "grpo", s)]
        else:
            batches, step = [b for s in mine for b in layouts(data == "packed", s)], layout_loss
        with engine.train_mode():
            metrics = engine.forward_backward_batch(batches, functools.partial(step, sp=sp))
            norm = engine.optimizer_step()
        extra = {k: metrics[k] for k in ("entropy", "accuracy") if k in metrics}
        results[name] = {"loss": metrics["loss"], "weight": metrics["weight"], "grad_norm": norm, **extra,
                         "attn": engine.attn_implementation, "exchanges": backend.exchanges,
                         "micro_batches": len(batches)}
        if name == "qwen2-packed":  # whole sequences outside a split forward: the probe, greedy generation
            import torch

            prompts = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])  # the first row left-padded
            mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
            with engine.eval_mode():
                tokens = engine.generate(input_ids=prompts, attention_mask=mask, max_new_tokens=4, do_sample=False,
                                         pad_token_id=0)
            results[name].update(probe=engine.packed_input_supported(), generated=tokens.tolist(),
                                 exchanges_after=backend.exchanges, group_sum=float(sp.group_sum(rank + 1.0)))
    return results


def _relative(got, want):
    return abs(got - want) / abs(want)


FOUR_RANK_CASES = ["qwen2-packed", "qwen2-kv1-packed"]


def _one_rank(rank):
    """Everything the tests below need from one plain rank, in one spawn: every case on one micro-batch per seed
    7, the four-rank cases with seeds 7 and 8, and the engine's refusals."""
    return {"every_case": _measure(rank, list(CASES), 1), "two_seeds": _measure(rank, FOUR_RANK_CASES, 1, (7, 8)),
            "refusals": _refusals(rank)}


@pytest.fixture(scope="module")
def one_rank():
    return run_ranks(_one_rank, world_size=1)[0]


def test_sp2_matches_one_rank_for_every_model_layout_and_wrapper(one_rank):
    names = list(CASES)
    want = one_rank["every_case"]
    got = run_ranks(_measure, names, 2, world_size=2)
    worst = 0.0
    for name in names:
        assert got[0][name] == got[1][name], (name, got[0][name], got[1][name])  # ranks of the group agree
        assert got[0][name]["attn"] == "ulysses" and want[name]["attn"] != "ulysses"
        assert got[0][name]["weight"] == want[name]["weight"]  # each token counted once per group
        # 4 exchanges per attention layer forward (q, k, v, output) and 4 in its backward; 2 layers, each
        # checkpointed layer's forward once more in the backward.
        forwards = 2 if name.endswith("checkpointed-padded") else 1
        assert got[0][name]["exchanges"] == got[0][name]["micro_batches"] * 2 * 4 * (1 + forwards)
        assert want[name]["exchanges"] == 0
        for key in ("loss", "grad_norm", "entropy", "accuracy"):
            if key not in want[name]:
                continue
            error = _relative(got[0][name][key], want[name][key])
            worst = max(worst, error)
            assert error <= TOLERANCE, (name, key, got[0][name][key], want[name][key])
    whole = got[0]["qwen2-packed"]
    assert whole["probe"] and whole["generated"] == want["qwen2-packed"]["generated"]
    assert whole["exchanges_after"] == whole["exchanges"]  # generation and the probe exchanged nothing
    print(f"sp=2 vs sp=1: max relative error of loss and gradient norm {worst:.2e}")


def _two_layouts_of_four_ranks(rank, names, seeds):
    return {size: _measure(rank, names, size, seeds) for size in (2, 4)}


def test_four_ranks_in_two_groups_or_one_match_one_rank(one_rank):
    """4 ranks as 2 groups of 2 (data parallel over the groups) and as 1 group of 4 (1 query head per rank; 2 or 1
    KV heads repeated 2 or 4 times) against one rank with every micro-batch."""
    names = FOUR_RANK_CASES
    want = one_rank["two_seeds"]
    got = run_ranks(_two_layouts_of_four_ranks, names, (7, 8), world_size=4)
    assert [r[2]["qwen2-packed"]["group_sum"] for r in got] == [3.0, 3.0, 7.0, 7.0]  # ranks 1+2 and 3+4
    assert [r[4]["qwen2-packed"]["group_sum"] for r in got] == [10.0] * 4
    assert {str(r[4]["qwen2-packed"]["generated"]) for r in got} == {str(want["qwen2-packed"]["generated"])}
    for size in (2, 4):
        for name in names:
            assert got[0][size][name]["weight"] == want[name]["weight"]
            for key in ("loss", "grad_norm"):
                assert _relative(got[0][size][name][key], want[name][key]) <= TOLERANCE, (size, name, key)
                assert {r[size][name][key] for r in got} == {got[0][size][name][key]}


def _refusals(rank):
    """What FSDPEngine says, before sharding anything, for a size the world or the model cannot take."""
    import functools

    from sp_cases import build_model

    from engine import EngineConfig, FSDPEngine
    from engine.tiny_model import tiny_qwen2

    said = []
    for model in (functools.partial(build_model, "qwen2"),
                  functools.partial(tiny_qwen2, vocab_size=32, hidden_size=24, heads=3, kv_heads=1)):
        try:
            FSDPEngine(model, EngineConfig(sequence_parallel_size=2))
        except ValueError as error:
            said.append(str(error))
    return said


def test_engine_refuses_a_size_the_world_or_the_model_cannot_take(one_rank):
    said = one_rank["refusals"]
    assert said[0] == ("invalid EngineConfig: engine.sequence_parallel_size=2 does not divide the world size 1: use "
                       "one of 1, or start a multiple of 2 processes")
    assert "does not divide the model's 3 attention heads: use one of 1, 3" in said[1]
