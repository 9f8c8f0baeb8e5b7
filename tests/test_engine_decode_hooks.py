"""Issue 49: a decode loop on the parameters FSDP2 gathered once for the whole call (``generate_gather="once"``)
runs its forwards without FSDP2's per-forward hooks (on 2 ranks: one rank alone is not sharded at all, so only the
2-rank side paid them). Every unit is unsharded already, so the hooks have nothing to do, yet they ran for every
unit at every decoded token: a fixed cost per token that more ranks do not shrink (each rank decodes as many
tokens as one rank alone, on half the rows). Counted (the hooks' calls into FSDP2's parameter groups), not timed;
the hooks are back, in order, after the call."""

from __future__ import annotations

import torch
from distributed import run_ranks
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

TOKENS = 5


def _forwards_and_hook_calls(rank):
    from engine import EngineConfig, FSDPEngine
    from engine.tiny_model import tiny_qwen2

    policy = FSDPEngine(lambda: tiny_qwen2(seed=0, vocab_size=64, max_positions=32, layers=2),
                        EngineConfig(fsdp_version=2))
    calls = []
    original = FSDPParamGroup.pre_forward

    def counted(group, *args, **kwargs):
        calls.append(group)
        return original(group, *args, **kwargs)

    FSDPParamGroup.pre_forward = counted
    hooks_before = [list(m._forward_pre_hooks) + list(m._forward_hooks) for m in policy.module.modules()]
    ids = torch.tensor([[3, 5, 7, 9]])
    try:
        with policy.generation_model() as model:
            inside = [model(input_ids=ids).logits for _ in range(TOKENS)]
        in_decode = len(calls)
        with torch.no_grad():
            outside = policy.module(input_ids=ids).logits
        after = len(calls) - in_decode
    finally:
        FSDPParamGroup.pre_forward = original
    hooks_after = [list(m._forward_pre_hooks) + list(m._forward_hooks) for m in policy.module.modules()]
    return in_decode, after, hooks_before == hooks_after, all(torch.equal(x, outside) for x in inside)


def test_decoding_on_gathered_parameters_runs_no_fsdp_hooks_and_puts_them_back():
    for in_decode, after, hooks_restored, same_logits in run_ranks(_forwards_and_hook_calls):
        assert in_decode == 0  # before the change: TOKENS forwards x 3 units (the root and 2 layers) = 15
        assert after == 3  # outside the call every unit's hook runs again
        assert hooks_restored and same_logits  # the same hooks in the same order; the same logits with and without


def _forward_only_pass_gathers(rank):
    """Unshards of FSDP2's parameter groups and hook calls in one forward-only log-prob pass over 8 micro-batches."""
    from engine import EngineConfig, FSDPEngine
    from engine.packing import SequenceBatch
    from engine.rl.batches import Batching, StepData, plan_updates
    from engine.rl.logprobs import planned_log_probs
    from engine.tiny_model import tiny_qwen2

    policy = FSDPEngine(lambda: tiny_qwen2(seed=0, vocab_size=64, max_positions=32, layers=2),
                        EngineConfig(fsdp_version=2))
    g = torch.Generator().manual_seed(rank)
    prompts, responses = [torch.randint(0, 64, (3,), generator=g) for _ in range(8)], [
        torch.randint(0, 64, (4,), generator=g) for _ in range(8)]
    sequences = SequenceBatch.from_parts(prompts, responses)
    data = StepData(sequences, torch.ones(8, 4, dtype=torch.long), torch.zeros(8),
                    plan_updates(sequences, Batching(8, 2, None, 1, packed=True), 1), 0, True)
    counts = {"unshard": 0, "pre_forward": 0}
    originals = {name: getattr(FSDPParamGroup, name) for name in counts}

    def counting(name):
        def counted(group, *args, **kwargs):
            counts[name] += 1
            return originals[name](group, *args, **kwargs)
        return counted

    for name in counts:
        setattr(FSDPParamGroup, name, counting(name))
    try:
        with policy.eval_mode():
            planned_log_probs(policy, data, 1.0, "old")
    finally:
        for name, original in originals.items():
            setattr(FSDPParamGroup, name, original)
    return counts, sum(1 for _ in data.rank_layouts())


def test_a_forward_only_pass_gathers_each_unit_once_for_all_its_micro_batches():
    """The old, reference and teacher log-probs: each unit gathered once for the pass (before: each layer once per
    micro-batch, and the root too: 24 unshards and 24 hook calls over 8 micro-batches)."""
    for counts, micro_batches in run_ranks(_forward_only_pass_gathers):
        assert micro_batches == 8
        assert counts == {"unshard": 3, "pre_forward": 0}, counts
