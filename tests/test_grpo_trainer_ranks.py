"""GRPOTrainer on 2 real gloo ranks with the fixture model: on-policy sampling with every rollout engine (top-k and
top-p included), EOS masking, a plugin engine with its own copy of the model receiving exactly the trained
weights, the loss modes' gradients against a hand-computed reference, the skipped old-log-prob forward, the LoRA
reference and the process-group timeout. One spawn runs all the checks (a spawn costs seconds of imports)."""

import dataclasses
import shutil

import pytest
import torch
from distributed import run_ranks
from engine_checks import full_params
from grpo_data import fixture_model, set_generation_config, verl_rows, write_parquet

pytestmark = pytest.mark.slow

ENGINES = ("hf", "hf-continuous", "test-copy")  # the built-in engines and tests/rollout_copy_plugin.py's
TOP_K, TOP_P = 400, 0.9  # both truncate: 400 of the 2,048 tokens at most, then the top 90% of what is left

BASE = ["train.prompts_per_step=2", "rollout.n=4", "train.mini_batch_size=4", "train.micro_batch_size=2",
        "rollout.max_new_tokens=10", "rollout.temperature=0.9", "algorithm.kl_loss_coef=0", "run.progress=false",
        "data.reward=grpo_rewards:compute_score"]


def _trainer(tmp, model_dir, data_path, *overrides):
    from pathlib import Path

    from engine.grpo.config import build_config
    from engine.grpo.trainer import GRPOTrainer

    config = build_config(None, None, [*BASE, f"model.path={model_dir}", f"data.path={data_path}", *overrides])
    return GRPOTrainer(config, Path(tmp), resume=False)


def _full_grads(module):
    return [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for p in module.parameters() if p.grad is not None]


def _forward_widths(trainer):
    """The sequence width of every forward of the actor (generate's are the prompt's, then 1)."""
    widths = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            widths.append(ids.size(1))

    return widths, trainer.actor.module.register_forward_pre_hook(hook, with_kwargs=True)


def _full_model(model_config):
    """An unsharded copy of the policy: the model source is a factory, or a directory the engine loads itself."""
    from transformers import AutoModelForCausalLM

    from engine.grpo.model import build_model

    source = build_model(model_config)[1]
    return source() if callable(source) else AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)


def _hand_reference_grads(trainer, rank_data, mode):
    """The loss of the whole global batch (both ranks' sequences) on an unsharded copy, aggregated by hand."""
    from engine.grpo.logprobs import position_ids
    model = _full_model(trainer.config.model)
    per_token, masks = [], []
    for data in rank_data:
        batch = data["batch"]
        # The plain formula: full logits, full log-softmax (independent of engine.grpo.logprobs' slicing).
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=position_ids(batch["attention_mask"])).logits
        logits = logits[:, batch["prompt_length"] - 1:-1] / trainer.config.rollout.temperature
        targets = batch["input_ids"][:, batch["prompt_length"]:]
        log_probs = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(log_probs - log_probs.detach())
        per_token.append(-data["advantages"].unsqueeze(-1) * ratio)
        masks.append(batch["response_mask"].float())
    sums = [(values * mask).sum(dim=1) for values, mask in zip(per_token, masks, strict=True)]
    lengths = [mask.sum(dim=1) for mask in masks]
    if mode == "token-sum":
        loss = sum(s.sum() for s in sums)
    elif mode == "token-mean":
        loss = sum(s.sum() for s in sums) / sum(n.sum() for n in lengths)
    elif mode == "seq-mean-token-sum":
        loss = torch.cat(sums).mean()
    elif mode == "seq-mean-token-sum-norm":  # Dr. GRPO: divided by rollout.max_new_tokens (10)
        loss = torch.cat(sums).mean() / trainer.config.rollout.max_new_tokens
    elif mode == "micro-batch-token-mean":  # bnpo: the mean of the 4 micro-batches' token means (2 per rank)
        means = [(values[rows] * mask[rows]).sum() / mask[rows].sum().clamp(min=1)
                 for values, mask in zip(per_token, masks, strict=True) for rows in (slice(0, 2), slice(2, 4))]
        loss = torch.stack(means).mean()
    else:
        loss = torch.cat([s / n.clamp(min=1) for s, n in zip(sums, lengths, strict=True)]).mean()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def _checks(rank, tmp, model_dir, greedy_dir, data_path):
    import torch.distributed as dist

    out = {}
    # -- the process-group timeout comes from engine.dist_timeout_s (the trainer creates the group) ---------------
    trainer = _trainer(tmp, greedy_dir, data_path, "engine.dist_timeout_s=77")
    group = dist.distributed_c10d._get_default_group()
    out["timeout_s"] = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()

    # -- on-policy, every engine: the model's greedy + repetition_penalty=2.0 + min_p + top_k=1 config is not
    # inherited, and the trainer's log-probs (temperature, top-k, top-p) equal the sampling distribution's --------
    samples = trainer.task.sample(2, torch.Generator().manual_seed(rank))
    from engine.grpo.rollout import batched_log_probs, rollout
    from engine.grpo.rollout_engines import RolloutContext, create_rollout_engine

    sampling = dataclasses.replace(trainer.sampling, n=4, max_new_tokens=10, temperature=0.9, top_k=TOP_K,
                                   top_p=TOP_P, log_probs=True)
    context = RolloutContext(trainer.actor, trainer.tokenizer, trainer.config.model.path, trainer.config.rollout)
    eos_ids = set(trainer.tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    out["eos_ids"] = sorted(eos_ids) if sorted(sampling.eos_token_ids) == sorted(eos_ids) else None
    out["engines"] = {}
    for name in ENGINES:
        torch.manual_seed(100 + rank)
        with trainer.actor.eval_mode():
            batch = rollout(create_rollout_engine(name, context), trainer.tokenizer, [s.prompt for s in samples],
                            sampling)
            old = batched_log_probs(trainer.actor, batch, 2, 0.9)
        mask = batch.response_mask.bool()
        ends = []
        for ids, row_mask in zip(batch.response_ids.tolist(), batch.response_mask.tolist(), strict=True):
            first = next((i for i, t in enumerate(ids) if t in eos_ids), None)
            ends.append((first, sum(row_mask), len(ids)))
        out["engines"][name] = {
            "on_policy_max_diff": (batch.sampling_log_probs - old)[mask].abs().max().item(),
            "distinct_in_group": min(len({tuple(r.tolist()) for r in batch.response_ids[g * 4:(g + 1) * 4]})
                                     for g in range(2)),
            "eos_ends": ends,  # (index of the first EOS of either id, mask length, width)
            "eos_kinds": sorted({ids[first] for ids, (first, _, _) in zip(batch.response_ids.tolist(), ends,
                                                                          strict=True) if first is not None}),
            "tokens": int(mask.sum()),
        }
    out["prompt_has_template"] = samples[0].prompt.startswith("<|im_start|>system")

    # -- a plugin engine with its own copy of the model gets exactly the trained weights after each update -------
    from pathlib import Path

    Path(tmp + "-copy").mkdir(parents=True, exist_ok=True)
    copy = _trainer(tmp + "-copy", model_dir, data_path, "rollout.engine=test-copy", "train.steps=2",
                    "engine.lr=0.05", "data.reward=grpo_rewards:length_penalty")  # a reward that always varies
    import rollout_copy_plugin

    expected = [{n: rollout_copy_plugin.digest(t) for n, t in full_params(copy.actor).items()}]
    update = copy.update

    def update_and_record(data):
        result = update(data)
        expected.append({n: rollout_copy_plugin.digest(t) for n, t in full_params(copy.actor).items()})
        return result

    copy.update = update_and_record
    copy.train()
    plugin = copy.rollout_engine
    out["copy_engine"] = {"received": plugin.received, "expected": expected,
                          "own_equals_actor": all(torch.equal(p, full_params(copy.actor)[n])
                                                  for n, p in plugin.model.named_parameters())}

    # -- issue 12: one update per step reuses the policy's own log-probs; the old-log-prob forward is gone -------
    widths, handle = _forward_widths(trainer)
    data_by_path = {}
    for reuse in (False, True):
        trainer.reuse_policy_log_probs = reuse
        widths.clear()
        data, _ = trainer.collect(step=0)
        data_by_path[reuse] = data
        out[f"collect_forwards_{reuse}"] = widths.count(data.batch.input_ids.size(1))
    handle.remove()
    results = {}
    data = data_by_path[False]
    data.advantages = torch.randn(len(data.batch), generator=torch.Generator().manual_seed(7 + rank))
    micro = [data.micro_batch(slice(s, s + 2)) for s in (0, 2)]
    with trainer.actor.train_mode():
        metrics_old = trainer.actor.forward_backward_batch(micro, trainer._step_fn)
        grads_old = _full_grads(trainer.actor.module)
        trainer.actor.zero_grad()
        data.old_log_probs = None
        micro = [data.micro_batch(slice(s, s + 2)) for s in (0, 2)]
        metrics_new = trainer.actor.forward_backward_batch(micro, trainer._step_fn)
        grads_new = _full_grads(trainer.actor.module)
        trainer.actor.zero_grad()
    results["grad_max_diff"] = max((a - b).abs().max().item() for a, b in zip(grads_old, grads_new, strict=True))
    results["loss_old_new"] = (metrics_old["loss"], metrics_new["loss"])
    out.update(results)

    # -- every loss_agg mode: gradients over 2 micro-batches x 2 ranks equal a hand-computed global loss ---------
    shared = {"batch": {"input_ids": data.batch.input_ids, "attention_mask": data.batch.attention_mask,
                        "response_mask": data.batch.response_mask, "prompt_length": data.batch.prompt_length},
              "advantages": data.advantages}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, shared)
    out["agg_max_rel_diff"] = {}
    for mode in ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                 "micro-batch-token-mean"):
        trainer.config.algorithm.loss_agg = mode
        with trainer.actor.train_mode():
            trainer.actor.forward_backward_batch(micro, trainer._step_fn)
            got = _full_grads(trainer.actor.module)
            trainer.actor.zero_grad()
        want = _hand_reference_grads(trainer, everyone, mode)
        scale = max(w.abs().max().item() for w in want)
        out["agg_max_rel_diff"][mode] = max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) / scale

    # -- LoRA + KL: the reference is the actor's base with adapters disabled, not a second copy -------------------
    lora = _trainer(tmp, model_dir, data_path, "engine.lora_rank=4", "algorithm.kl_coef=0.01")
    out["lora_reference_engine"] = lora.reference is not None
    engines = [e for e in (lora.actor, lora.reference) if e is not None]
    base_numel = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                     for e in engines for name, p in e.module.named_parameters() if "lora_" not in name)
    model_numel = sum(p.numel() for p in _full_model(lora.config.model).parameters())
    out["base_numel_local_vs_full"] = (base_numel, model_numel)
    for name, param in lora.actor.module.named_parameters():
        if "lora_B" in name:
            with torch.no_grad():
                local = param.to_local() if hasattr(param, "to_local") else param
                local.normal_(std=0.5, generator=torch.Generator().manual_seed(3))
    with lora.actor.eval_mode():
        lora_batch = rollout(lora.rollout_engine, lora.tokenizer, [s.prompt for s in samples],
                             dataclasses.replace(lora.sampling, n=2, max_new_tokens=6, temperature=1.0))
        actor_lp = batched_log_probs(lora.actor, lora_batch, 2, 0.9)
    ref_lp = lora.reference_log_probs(lora_batch)
    from engine.grpo.logprobs import response_log_probs

    with torch.no_grad():
        base_lp = response_log_probs(_full_model(lora.config.model), lora_batch.input_ids, lora_batch.attention_mask,
                                     lora_batch.prompt_length, 0.9)  # rollout.temperature
    m = lora_batch.response_mask.bool()
    out["ref_vs_base"] = (ref_lp - base_lp)[m].abs().max().item()
    out["actor_vs_base"] = (actor_lp - base_lp)[m].abs().max().item()
    return out


@pytest.fixture(scope="module")
def fixture_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo-ranks")
    model_dir = fixture_model(root / "model")
    greedy_dir = root / "greedy"
    shutil.copytree(model_dir, greedy_dir)
    set_generation_config(greedy_dir, do_sample=False, repetition_penalty=2.0, min_p=0.5, top_k=1)
    data_path = write_parquet(root / "train.parquet", verl_rows())
    return root, model_dir, greedy_dir, data_path


def test_trainer_on_two_ranks(fixture_dirs):
    root, model_dir, greedy_dir, data_path = fixture_dirs
    outs = run_ranks(_checks, str(root / "run"), str(model_dir), str(greedy_dir), str(data_path),
                     env={"ACCEL_BACKENDS_PLUGINS": "rollout_copy_plugin"})
    for rank, out in enumerate(outs):
        assert out["timeout_s"] == 77.0
        assert out["prompt_has_template"] and out["eos_ids"]
        assert set(out["engines"]) == set(ENGINES)
        for name, engine in out["engines"].items():
            # Sampled from sampling_scores (temperature, top-k, top-p), not the model's greedy / penalised config,
            # and the trainer's log-probs are of that same distribution.
            assert engine["on_policy_max_diff"] < 1e-4, (name, engine["on_policy_max_diff"])
            assert engine["distinct_in_group"] >= 2, name
            for first_eos, mask_length, width in engine["eos_ends"]:
                assert mask_length == (first_eos + 1 if first_eos is not None else width), (name, engine)
            assert any(first is not None for first, _, _ in engine["eos_ends"]), f"{name}: the EOS never came"
            assert engine["tokens"] > 2 * 8, (name, "responses too short to say anything")
        # Over both ranks and every engine, both EOS ids ended responses.
        assert {kind for o in outs for e in o["engines"].values() for kind in e["eos_kinds"]} == set(out["eos_ids"])
        copy = out["copy_engine"]
        # At the start and after each of the 2 updates: every tensor, bit for bit, and the weights did change.
        assert copy["received"] == copy["expected"] and len(copy["received"]) == 3
        assert copy["expected"][0] != copy["expected"][1] != copy["expected"][2]
        assert copy["own_equals_actor"]
        # Old path: one log-prob forward per micro-batch (4 sequences per rank / 2) in collect; new path: none.
        assert out["collect_forwards_False"] == 2 and out["collect_forwards_True"] == 0, out
        assert out["grad_max_diff"] < 1e-5 and out["loss_old_new"][0] == pytest.approx(out["loss_old_new"][1],
                                                                                        abs=1e-6)
        for mode, diff in out["agg_max_rel_diff"].items():
            assert diff < 1e-4, (rank, mode, diff)
        assert not out["lora_reference_engine"]
        local, full = out["base_numel_local_vs_full"]
        assert local <= full / 2 * 1.05, "more than one (sharded) copy of the base weights on a rank"
        assert out["ref_vs_base"] < 1e-5 and out["actor_vs_base"] > 1e-3, out
