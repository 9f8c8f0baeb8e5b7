"""The engine's side of rollout engines on 2 ranks: collectives per call (counts, not times) and full weights.

With the whole model gathered for the call (``generate_gather="once"``, the default) only the gathers remain: no
per-token all-reduce, and the ranks decode different numbers of tokens without waiting for each other. Before,
``generate(synced_gpus=True)`` paid one all-reduce per new token. With ``"per_layer"`` every forward is a
collective, and both engines keep the ranks in step. ``iter_full_weights`` gives every weight, gathered one unit
at a time (one all-gather per unit), with LoRA merged into plain names. FSDP2, FSDP1 and LoRA; one spawn for all
(a module fixture; each test asserts one part of its counts, so that one failure does not hide the others).
"""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow

ENGINES = ("hf", "hf-continuous")
POLICIES = {"fsdp2": {}, "fsdp1": {"fsdp_version": 1}, "lora": {"lora_rank": 4},
            "lora_fsdp1": {"lora_rank": 4, "fsdp_version": 1}, "fsdp2_per_layer": {"generate_gather": "per_layer"}}


def _counts(rank):
    from types import SimpleNamespace

    import torch
    from engine_checks import CollectiveCounter
    from tiny import VOCAB, tiny_qwen2

    from engine import EngineConfig, FSDPEngine
    from engine.rollout.engines import RolloutContext, SamplingConfig, create_rollout_engine

    tokenizer = SimpleNamespace(pad_token_id=0)  # the built-in engines take only the pad id from it
    prompts = [[5, 7, 11], [13, 17, 19, 23]]
    # Each rank its own length: rank 0 stops after 2 tokens, rank 1 after 7. The EOS id is outside the vocabulary,
    # so no response ends early.
    sampling = SamplingConfig(n=2, max_new_tokens=2 + 5 * rank, eos_token_ids=(VOCAB,))
    out = {}
    for label, options in POLICIES.items():
        policy = FSDPEngine(tiny_qwen2, EngineConfig(**options))
        row = {"units": policy.num_sharded_units, "collective_generation": policy.generation_is_collective}
        with policy.eval_mode():
            for name in ENGINES:
                engine = create_rollout_engine(name, RolloutContext(policy, tokenizer, tiny_qwen2))
                engine.generate(prompts, sampling)  # warm-up: FSDP's lazy initialisation communicates
                with CollectiveCounter() as counter:
                    responses = engine.generate(prompts, sampling)
                row[name] = dict(counter.counts, lengths=responses.mask.sum(dim=1).tolist(),
                                 computed=responses.tokens_computed)
            ids = torch.tensor([prompts[0]] * 2)
            with CollectiveCounter() as counter:  # the pre-change rollout: synced_gpus on every multi-rank call
                policy.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
                                max_new_tokens=sampling.max_new_tokens, min_new_tokens=sampling.max_new_tokens,
                                synced_gpus=True)
            row["generate_synced"] = dict(counter.counts)
        if label != "fsdp2_per_layer":
            row["weights"] = _full_weights(policy, tiny_qwen2)
        out[label] = row
    return out


def _full_weights(policy, build_plain_model):
    """What iter_full_weights gives, against the weights gathered another way (or, with LoRA, a forward)."""
    import torch
    from engine_checks import CollectiveCounter, full_params

    lora = any("lora_B" in name for name, _ in policy.module.named_parameters())
    if lora:  # B starts at zero, which would make merging a no-op
        for name, param in policy.module.named_parameters():
            if "lora_B" in name:
                with torch.no_grad():
                    local = param.to_local() if hasattr(param, "to_local") else param
                    local.normal_(std=0.3, generator=torch.Generator().manual_seed(5))
    with CollectiveCounter() as counter:
        weights = {name: tensor.clone() for name, tensor in policy.iter_full_weights()}
    plain = build_plain_model()
    result = {"all_gather": counter.counts["all_gather"],
              "names_are_the_plain_models": set(weights) == set(dict(plain.named_parameters()))}
    if lora:  # the merged weights in a plain model compute what the PEFT model computes
        plain.load_state_dict(weights)
        ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
        with torch.no_grad(), policy.eval_mode():
            want = policy.module(input_ids=ids).logits
            result["lora_changes_the_output"] = (want - build_plain_model()(input_ids=ids).logits).abs().max().item()
            result["merged_max_diff"] = (plain(input_ids=ids).logits - want).abs().max().item()
        result.update(_adapter_alone(policy, set(dict(plain.named_parameters()))))
    else:
        gathered = full_params(policy)
        result["equal"] = set(gathered) == set(weights) and all(torch.equal(gathered[n], weights[n]) for n in weights)
    return result


def _adapter_alone(policy, plain_names):
    """iter_adapter_weights (the adapter's shards gathered, in two all-gathers) against the adapter tensors of a
    whole-unit gather, and iter_full_weights(base_only=True) against its base weights."""
    import torch
    from engine_checks import CollectiveCounter

    everything = {name: tensor.clone() for name, tensor in policy.iter_full_weights(merge_lora=False)}
    with CollectiveCounter() as counter:
        adapter = dict(policy.iter_adapter_weights())
    base = {name: tensor.clone() for name, tensor in policy.iter_full_weights(base_only=True)}
    unmerged = {name.removeprefix("base_model.model.").replace(".base_layer.", "."): tensor
                for name, tensor in everything.items() if ".lora_" not in name}
    return {"adapter_all_gather": counter.counts["all_gather"], "adapter_other": sum(counter.counts.values()),
            "adapter_tensors": len(adapter),
            "adapter_equal": set(adapter) == {n.replace(".default.", ".") for n in everything if ".lora_" in n}
            and all(torch.equal(adapter[n.replace(".default.", ".")], everything[n]) for n in everything
                    if ".lora_" in n),
            "base_equal": set(base) == plain_names == set(unmerged)
            and all(torch.equal(base[n], unmerged[n]) for n in base)}


@pytest.fixture(scope="module")
def outs():
    """Both ranks' counts of the one spawn; each test below checks one policy's or one engine's part of them."""
    return run_ranks(_counts)


@pytest.mark.parametrize("label", POLICIES)
def test_collectives_per_generate_call(outs, label):
    for rank, out in enumerate(outs):
        length = 2 + 5 * rank
        row = out[label]
        units = row["units"]
        assert units == 3, (label, row)  # two decoder layers and the root
        for name in ENGINES:
            counts = row[name]
            assert counts["lengths"] == [length] * 4, (label, name, counts)
            assert counts.get("reduce_scatter", 0) == 0
            if label == "fsdp2_per_layer":
                # Forwards are collectives: one "anyone still decoding?" all-reduce per step (hf's synced_gpus
                # too) for the longer rank's 7 steps + the final one; the root gathered for the call and each
                # layer on each of the 7 forwards (the shorter rank's last 5 keep the other company).
                assert row["collective_generation"] and counts["all_reduce"] == 8, (label, name, counts)
                assert counts["all_gather"] == 1 + (units - 1) * 7, (label, name, counts)
            else:
                assert not row["collective_generation"]
                assert counts.get("all_reduce", 0) == 0, (label, name, counts)
                assert counts["all_gather"] == units, (label, name, counts)  # each unit once per call
        assert row["generate_synced"]["all_reduce"] == 8, (label, row)  # before: one per token + 1


@pytest.mark.parametrize("label", [label for label in POLICIES if label != "fsdp2_per_layer"])
def test_full_weights_one_unit_at_a_time(outs, label):
    for out in outs:
        row = out[label]
        weights = row["weights"]
        assert weights["all_gather"] == row["units"] and weights["names_are_the_plain_models"], (label, weights)
        if label.startswith("lora"):
            assert weights["lora_changes_the_output"] > 1e-2 and weights["merged_max_diff"] < 1e-4, weights
            # The adapter alone: its shards in two all-gathers (sizes, pieces), whatever the layers; the base alone
            assert weights["adapter_all_gather"] == weights["adapter_other"] == 2, weights
            assert weights["adapter_tensors"] == 2 * 7 * 2 and weights["adapter_equal"], weights  # A, B x 7 x 2
            assert weights["base_equal"], weights
        else:
            assert weights["equal"], label


def test_continuous_batching_computes_only_what_it_produces(outs):
    # hf keeps every row for every step; hf-continuous computes what it produces.
    for rank, out in enumerate(outs):
        length = 2 + 5 * rank
        assert out["fsdp2"]["hf"]["computed"] == out["fsdp2"]["hf-continuous"]["computed"] == 4 * length
