"""Multi-turn rollouts with tools on real gloo ranks: the loss mask, not the attention mask, leaves out tool and
template tokens. With the scripted engine (tests/agent_script_plugin.py, every trajectory: one calculator call,
its result, an answer) the token counts are known; the trainer's old and reference log-prob passes (FSDP2
packed, FSDP1 padded, LoRA both) attend to the tool tokens (they equal the engine's teacher-forced log-probs at the
model's tokens) and the gradients of every aggregation (with an entropy bonus) equal a hand-computed loss over
the model's tokens only, on an unsharded copy of the engine's model. LoRA: a PEFT model holding the engine's
gathered adapters, its packed and padded gradients both checked, the KL to its base (which differs from it)
included; a loss over every attended token, or one without the KL, gives other gradients, so the comparison can
fail. The built-in engines run under the loop too. One 2-rank and one 1-rank spawn."""

import dataclasses
import json

import pytest
import torch
from distributed import run_ranks

pytestmark = pytest.mark.slow

BASE = ["train.prompts_per_step=4", "rollout.n=2", "train.prompts_per_update=2", "train.micro_batch_size=2",
        "rollout.max_new_tokens=200", "rollout.temperature=0.9", "algorithm.kl_loss_coef=0", "run.progress=false",
        "rollout.engine=test-script", "rollout.tools=[agent_tools:calculator]",
        "data.reward=agent_tools:correct_answer"]
ENV = {"ACCEL_BACKENDS_PLUGINS": "agent_script_plugin", "ACCEL_TEST_SCRIPT": "calculator"}


def _trainer(tmp, model_dir, data_path, *overrides):
    from pathlib import Path

    from engine.rl.algorithms.grpo.config import build_config
    from engine.train.registry import get_recipe

    config = build_config(None, None, [*BASE, f"model.path={model_dir}", f"data.path={data_path}", *overrides])
    return get_recipe("grpo").trainer_of(config, Path(tmp), resume=False)


def _full_grads(module):
    """``{name: full gradient}`` of the parameters that have one, named as in the unwrapped model."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(module, FSDP):
        with FSDP.summon_full_params(module, with_grads=True):
            return {name.replace("_fsdp_wrapped_module.", ""): p.grad.clone()
                    for name, p in module.named_parameters() if p.grad is not None}
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for name, p in module.named_parameters() if p.grad is not None}


def _rel_diff(got, want):
    """The largest gradient difference, relative to the largest reference gradient; the names must match."""
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())[:4]
    scale = max(w.abs().max().item() for w in want.values())
    return max((got[name] - want[name]).abs().max().item() for name in want) / scale


def _grads_of(model, loss):
    """``{name: gradient}`` of ``loss`` for ``model``'s trainable parameters (LoRA: the adapters only)."""
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _hand_model(trainer, model_dir):
    """An unsharded fp32 copy of the engine's model: the base from disk, for LoRA wrapped as the engine wraps it
    and holding every weight the engine gathers (its adapters included)."""
    from transformers import AutoModelForCausalLM

    from engine import apply_lora

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if trainer.actor.config.lora_rank > 0:
        model = apply_lora(model, trainer.actor.config)
        gathered = {name: tensor.float().clone() for name, tensor in trainer.actor.iter_full_weights(merge_lora=False)}
        missing, unexpected = model.load_state_dict(gathered, strict=False)
        assert not unexpected and not any(".lora_" in name for name in missing), (missing, unexpected)
    return model


def _expected_mask(tokenizer, prompt_ids):
    """The loss mask of the scripted trajectory for a prompt: the call, the result's tokens, the answer."""
    import agent_script_plugin
    import agent_tools

    from engine.rollout.multi_turn.template import encode

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    conversation = tokenizer.decode(prompt_ids, skip_special_tokens=False)
    call = agent_script_plugin.scripted_turn(conversation, 0.0, "calculator")
    result = agent_tools.calculator(json.loads(call.split("\n")[1])["arguments"]["expression"])
    inserted = encode(tokenizer, f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n"
                                 "<|im_start|>assistant\n")
    answer = tokenizer(f"The answer is {result}.", add_special_tokens=False)["input_ids"] + [end]
    model_call = tokenizer(call, add_special_tokens=False)["input_ids"] + [end]
    return [1] * len(model_call) + [0] * len(inserted) + [1] * len(answer)


def _token_log_probs(model, ids, start, end, temperature):
    logits = model(input_ids=ids[None, :end]).logits[0, start - 1:end - 1].float() / temperature
    log_softmax = torch.log_softmax(logits, -1)
    return log_softmax.gather(-1, ids[start:end, None])[:, 0], log_softmax


def _hand_loss(model, data, indices, temperature, mode, entropy_coeff, every_token=False, reference=None,
               kl_coef=0.0):
    """The mini-batch's loss on an unsharded copy, one whole sequence at a time (tool tokens in the forward),
    aggregated by hand over the loss mask (``every_token``: over every attended token, the wrong loss); with a
    ``reference`` model, plus ``kl_coef`` times the k3 KL to it over the same tokens."""
    sums, counts, entropies, kls = [], [], [], []
    for i in indices:
        start, end = int(data.sequences.starts[i]), int(data.sequences.lengths[i])
        ids = data.sequences.tokens[i]
        log_probs, log_softmax = _token_log_probs(model, ids, start, end, temperature)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
        mask = data.loss_mask[i, :end - start].float()
        mask = torch.ones_like(mask) if every_token else mask
        ratio = torch.exp(log_probs - log_probs.detach())
        sums.append((-data.advantages[i] * ratio * mask).sum())
        entropies.append((entropy * mask).sum())
        counts.append(mask.sum())
        if reference is not None:
            with torch.no_grad():
                reference_log_probs = _token_log_probs(reference, ids, start, end, temperature)[0]
            log_ratio = reference_log_probs - log_probs
            kls.append(((torch.exp(log_ratio) - log_ratio - 1) * mask).sum())
    counts = torch.stack(counts)

    def aggregate(values):
        values = torch.stack(values)
        if mode == "token-mean":
            return values.sum() / counts.sum()
        if mode == "token-sum":
            return values.sum()
        return (values / counts).mean()  # seq-mean-token-mean

    loss = aggregate(sums) - entropy_coeff * aggregate(entropies)
    return loss + kl_coef * aggregate(kls) if reference is not None else loss


def _variant(rank, tmp, model_dir, data_path, name, overrides, modes, also_padded=False):
    from transformers import AutoModelForCausalLM

    from engine.rl.logprobs import planned_log_probs
    from engine.runtime import all_gather_rows

    trainer = _trainer(f"{tmp}/{name}", model_dir, data_path, *overrides)
    trainer.sampling = dataclasses.replace(trainer.sampling, log_probs=True)
    if name == "lora":
        for param_name, param in trainer.actor.module.named_parameters():
            if "lora_B" in param_name:  # non-zero adapters: the policy differs from the (adapter-free) reference
                with torch.no_grad():
                    local = param.to_local() if hasattr(param, "to_local") else param
                    local.normal_(std=0.03, generator=torch.Generator().manual_seed(5))
    real_engines = _real_engines(rank, trainer, model_dir) if name == "fsdp2_packed" else None
    batches, multi_turn = [], trainer.sampler
    trainer.sampler = lambda *args: batches.append(multi_turn(*args)) or batches[-1]
    data, stats, _ = trainer.collect(0)
    (batch,) = batches
    out = {"packed": trainer.packed,
           "stats": {k: v for k, v in stats.items() if k.startswith(("agent_", "response_tokens", "sequences"))},
           "real_engines": real_engines}
    # Known token counts: each row's loss mask is exactly the call, the result's tokens (0), the answer.
    width, lengths = batch.prompt_length, batch.attention_mask[:, batch.prompt_length:].sum(1)
    prompts = [batch.input_ids[row, :width][batch.attention_mask[row, :width].bool()].tolist()
               for row in range(len(batch))]
    out["masks_as_scripted"] = all(batch.response_mask[row, :int(lengths[row])].tolist()
                                   == _expected_mask(trainer.tokenizer, prompts[row]) for row in range(len(batch)))
    out["global"] = {"loss_tokens": int(data.loss_mask.sum()),
                     "response_tokens": int((data.sequences.lengths - data.sequences.starts).sum())}
    # The passes over the packed/padded plan attend to the tool tokens: at the model's tokens they equal the
    # engine's log-probs, teacher-forced over each whole left-padded trajectory.
    sampled = all_gather_rows({"lp": batch.sampling_log_probs.float()}, torch.device("cpu"))["lp"]
    mine = sorted(i for mini in data.mini_batches for micro in mini.plan.ranks[rank] for i in micro)
    if data.old_log_probs is None:
        with trainer.actor.eval_mode():
            data.old_log_probs = planned_log_probs(trainer.actor, data, 0.9, "old")
    mask = data.loss_mask.bool()
    width = min(sampled.size(1), mask.size(1))
    out["old_vs_sampled"] = max((data.old_log_probs[i, :width] - sampled[i, :width])[mask[i, :width]].abs().max()
                                .item() for i in mine)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if data.ref_log_probs is not None:  # the reference (a second engine, or LoRA's adapters disabled): the base
        worst = 0.0
        with torch.no_grad():
            for i in mine:
                start, end = int(data.sequences.starts[i]), int(data.sequences.lengths[i])
                want = _token_log_probs(base, data.sequences.tokens[i], start, end, 0.9)[0]
                got = data.ref_log_probs[i, :end - start]
                worst = max(worst, (got - want)[mask[i, :end - start]].abs().max().item())
        out["ref_vs_base"] = worst
    # LoRA's reference is its base (the adapters disabled) and its policy is not: the KL term has a gradient, and
    # the hand loss has it over the model's tokens too. A second engine's reference is the policy itself at step 0
    # (a KL of 0 with a 0 gradient): nothing to compare.
    lora = trainer.actor.config.lora_rank > 0
    kl_coef = 0.5 if lora and data.ref_log_probs is not None else 0.0
    if not kl_coef:
        data.ref_log_probs = None
    trainer.config.algorithm.kl_loss_coef = kl_coef
    trainer.reconfigure()  # the loss terms are built once
    data.advantages = torch.randn(len(data.sequences), generator=torch.Generator().manual_seed(7))
    plans = {"planned": data}
    if also_padded:  # the same global batch in padded micro-batches (its old-log-prob pass: its rows differ)
        from engine.rl.batches import StepData, plan_updates

        plans["padded"] = StepData(data.sequences, data.loss_mask, data.advantages,
                                   plan_updates(data.sequences, dataclasses.replace(trainer.batching, packed=False), 2),
                                   rank, packed=False)
        with trainer.actor.eval_mode():
            plans["padded"].old_log_probs = planned_log_probs(trainer.actor, plans["padded"], 0.9, "old")
        if kl_coef:
            plans["padded"].ref_log_probs = trainer.reference_log_probs(plans["padded"])
    hand = _hand_model(trainer, model_dir) if lora else base
    reference = base if kl_coef else None
    out["grads"] = {}
    for mode, entropy_coeff in modes:
        trainer.config.algorithm.loss_agg, trainer.config.algorithm.entropy_coeff = mode, entropy_coeff
        trainer.reconfigure()  # the loss terms are built once
        for plan_name, plan in plans.items():
            mini = plan.mini_batches[0]
            with trainer.actor.train_mode():
                metrics = trainer.actor.forward_backward_batch(plan.micro_batches(mini), trainer.loss_fn)
                got = _full_grads(trainer.actor.module)
                trainer.actor.zero_grad()
            loss = _hand_loss(hand, data, list(mini.indices), 0.9, mode, entropy_coeff, reference=reference,
                              kl_coef=kl_coef)
            want = _grads_of(hand, loss)
            out["grads"][f"{plan_name}/{mode}/{entropy_coeff}"] = {
                "loss": metrics["loss"], "hand_loss": loss.item(), "rel_diff": _rel_diff(got, want)}
    if also_padded:  # the check can fail: a loss over every attended token (tool tokens too) gives other gradients
        out["every_token_rel_diff"] = _rel_diff(got, _grads_of(hand, _hand_loss(
            hand, data, list(mini.indices), 0.9, mode, entropy_coeff, every_token=True, reference=reference,
            kl_coef=kl_coef)))
        if kl_coef:  # and the KL term weighs in the gradients compared (its mask matters too)
            out["without_kl_rel_diff"] = _rel_diff(got, _grads_of(hand, _hand_loss(
                hand, data, list(mini.indices), 0.9, mode, entropy_coeff)))
    return out


def _real_engines(rank, trainer, model_dir):
    """The built-in engines under the multi-turn loop, a different number of prompts on each rank (the random model
    calls no tool: one turn each, every token the model's own)."""
    from engine.rollout.engines import RolloutContext, create_rollout_engine

    results = {}
    samples = trainer.task.sample(1 + rank, torch.Generator().manual_seed(rank))
    sampling = dataclasses.replace(trainer.sampling, max_new_tokens=8)
    for name in ("hf", "hf-continuous"):
        engine = create_rollout_engine(name, RolloutContext(trainer.actor, trainer.tokenizer, model_dir,
                                                            trainer.config.rollout))
        with trainer.actor.eval_mode():
            batch = trainer.sampler(engine, samples, sampling)
        attended = batch.attention_mask[:, batch.prompt_length:]
        results[name] = {"rows": len(batch), "turns": batch.trajectories.turns.tolist(),
                         "loss_is_attention": torch.equal(attended, batch.response_mask),
                         "prompt_has_tools": "calculator" in trainer.tokenizer.decode(batch.input_ids[0])}
    return results


ALL_MODES = (("token-mean", 0.0), ("token-mean", 0.05), ("seq-mean-token-mean", 0.05), ("token-sum", 0.0))


def _two_ranks(rank, tmp, model_dir, data_path):
    return {
        "fsdp2_packed": _variant(rank, tmp, model_dir, data_path, "fsdp2_packed", ["algorithm.kl_loss_coef=0.01"],
                                 ALL_MODES),
        "fsdp1_padded": _variant(rank, tmp, model_dir, data_path, "fsdp1_padded",
                                 ["engine.fsdp_version=1", "train.padding_free=false"],
                                 (("token-mean", 0.05), ("seq-mean-token-mean", 0.0))),
        "lora": _variant(rank, tmp, model_dir, data_path, "lora", ["engine.lora_rank=4",
                                                                   "algorithm.kl_loss_coef=0.01"],
                         (("token-mean", 0.05), ("seq-mean-token-mean", 0.0)), also_padded=True),
    }


def _one_rank(rank, tmp, model_dir, data_path):
    return {"fsdp2_packed": _variant(rank, tmp, model_dir, data_path, "fsdp2_packed", [],
                                     (("token-mean", 0.05),))}


def test_tool_tokens_are_attended_to_but_get_no_loss(tmp_path):
    import agent_tools
    from grpo_data import fixture_model, write_jsonl

    model_dir = fixture_model(tmp_path / "model")
    data_path = write_jsonl(tmp_path / "arith.jsonl", agent_tools.arithmetic_rows())
    two = run_ranks(_two_ranks, str(tmp_path / "two"), str(model_dir), str(data_path), env=ENV)
    one = run_ranks(_one_rank, str(tmp_path / "one"), str(model_dir), str(data_path), world_size=1, env=ENV)
    for outs in (two, [one[0]]):
        for out in outs:
            for name, variant in out.items():
                assert variant["masks_as_scripted"], name
                stats = variant["stats"]
                assert stats["agent_tool_calls"] == stats["agent_turns"] / 2 == stats["sequences"] == 8 / len(outs)
                assert variant["old_vs_sampled"] < 1e-4, (name, variant["old_vs_sampled"])
                assert variant.get("ref_vs_base", 0.0) < 1e-4, (name, variant.get("ref_vs_base"))
                for mode, result in variant["grads"].items():
                    assert result["rel_diff"] < 1e-4, (name, mode, result)
                    assert abs(result["loss"] - result["hand_loss"]) < 1e-4 * max(1.0, abs(result["hand_loss"]))
    for name in ("fsdp2_packed", "fsdp1_padded", "lora"):
        a, b = two[0][name], two[1][name]
        assert a["global"] == b["global"]  # every rank holds the whole step's batch
        model_tokens = a["stats"]["response_tokens"] + b["stats"]["response_tokens"]
        tool_tokens = a["stats"]["agent_tool_tokens"] + b["stats"]["agent_tool_tokens"]
        assert a["global"]["loss_tokens"] == model_tokens  # the loss counts the model's tokens only
        assert a["global"]["response_tokens"] == model_tokens + tool_tokens > model_tokens  # attended: all of them
    assert two[0]["fsdp2_packed"]["packed"] and not two[0]["fsdp1_padded"]["packed"] and two[0]["lora"]["packed"]
    for rank, out in enumerate(two):
        for name, result in out["fsdp2_packed"]["real_engines"].items():
            assert result == {"rows": 2 * (1 + rank), "turns": [1] * 2 * (1 + rank), "loss_is_attention": True,
                              "prompt_has_tools": True}, (rank, name, result)
    assert "ref_vs_base" in two[0]["fsdp2_packed"] and "ref_vs_base" in two[0]["lora"]
    for out in two:  # LoRA: packed and padded both against the hand-computed loss, which tells the masks apart
        assert {mode.split("/")[0] for mode in out["lora"]["grads"]} == {"planned", "padded"}
        assert out["lora"]["every_token_rel_diff"] > 1e-2, out["lora"]["every_token_rel_diff"]
        assert out["lora"]["without_kl_rel_diff"] > 1e-2, out["lora"]["without_kl_rel_diff"]
