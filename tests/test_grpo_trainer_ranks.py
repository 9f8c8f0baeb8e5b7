"""The GRPO recipe's RL step on 2 real gloo ranks with the fixture model: on-policy sampling with every rollout engine
(top-k and top-p included), EOS masking, a plugin engine with its own copy of the model receiving exactly the trained
weights, the loss modes' gradients against a hand-computed reference, the skipped old-log-prob forward, the LoRA
reference and the process-group timeout. One spawn (a module fixture) runs all the checks, as a spawn costs seconds
of imports; each test asserts one property of its results, so that one failure does not hide the others."""

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
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                  "micro-batch-token-mean")

BASE = ["train.prompts_per_step=2", "rollout.n=4", "train.prompts_per_update=2", "train.micro_batch_size=2",
        "rollout.max_new_tokens=10", "rollout.temperature=0.9", "algorithm.kl_loss_coef=0", "run.progress=false",
        "data.reward=grpo_rewards:compute_score"]


def _trainer(tmp, model_dir, data_path, *overrides):
    from pathlib import Path

    from engine.rl.algorithms.grpo.config import build_config
    from engine.train.registry import get_recipe

    config = build_config(None, None, [*BASE, f"model.path={model_dir}", f"data.path={data_path}", *overrides])
    return get_recipe("grpo").trainer_of(config, Path(tmp), resume=False)


def _full_grads(module):
    return [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for p in module.parameters() if p.grad is not None]


def _log_prob_forwards(trainer):
    """Counts the actor's log-prob forwards (generate's forwards use a KV cache, the log-prob passes do not)."""
    count = []

    def hook(module, args, kwargs):
        if kwargs.get("use_cache") is False:
            count.append(1)

    return count, trainer.actor.module.register_forward_pre_hook(hook, with_kwargs=True)


def _full_model(model_config):
    """An unsharded copy of the policy: the model source is a factory, or a directory the engine loads itself."""
    from transformers import AutoModelForCausalLM

    from engine.rl.model import build_model

    source = build_model(model_config)[1]
    return source() if callable(source) else AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)


def _hand_reference_grads(trainer, data, mode):
    """The loss of the whole global batch (both ranks' sequences) on an unsharded copy, aggregated by hand."""
    model = _full_model(trainer.config.model)
    sums, lengths = [], []
    sequences = data.sequences
    for i in range(len(sequences)):
        # The plain formula, one sequence at a time: full logits, full log-softmax (independent of packing and of
        # engine.rl.logprobs' slicing).
        start, end = int(sequences.starts[i]), int(sequences.lengths[i])
        ids = sequences.tokens[i, :end].unsqueeze(0)
        logits = model(input_ids=ids).logits[0, start - 1:end - 1] / trainer.config.rollout.temperature
        log_probs = torch.log_softmax(logits, -1).gather(-1, ids[0, start:end].unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(log_probs - log_probs.detach())
        mask = data.loss_mask[i, :end - start].float()
        sums.append((-data.advantages[i] * ratio * mask).sum())
        lengths.append(mask.sum())
    sums, lengths = torch.stack(sums), torch.stack(lengths)
    if mode == "token-sum":
        loss = sums.sum()
    elif mode == "token-mean":
        loss = sums.sum() / lengths.sum()
    elif mode == "seq-mean-token-sum":
        loss = sums.mean()
    elif mode == "seq-mean-token-sum-norm":  # Dr. GRPO: divided by rollout.max_new_tokens (10)
        loss = sums.mean() / trainer.config.rollout.max_new_tokens
    elif mode == "micro-batch-token-mean":  # bnpo: the mean over every rank's micro-batches of their token means
        (mini,) = data.mini_batches
        micro_batches = [list(micro) for ranks in mini.plan.ranks for micro in ranks if micro]
        loss = torch.stack([sums[m].sum() / lengths[m].sum().clamp(min=1) for m in micro_batches]).mean()
    else:
        loss = (sums / lengths.clamp(min=1)).mean()
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
    from engine.rl.logprobs import response_log_probs
    from engine.rollout.engines import RolloutContext, create_rollout_engine
    from engine.rollout.single_turn import rollout

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
            with torch.no_grad():  # the trainer's log-probs under the same temperature, top-k and top-p
                old = response_log_probs(trainer.actor.module, batch.input_ids, batch.attention_mask,
                                         batch.prompt_length, 0.9, top_k=TOP_K, top_p=TOP_P)
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
    forwards, handle = _log_prob_forwards(trainer)
    data_by_path = {}
    for reuse in (False, True):
        trainer.reuse_policy_log_probs = reuse
        forwards.clear()
        data, _, _ = trainer.collect(step=0)
        data_by_path[reuse] = data
        out[f"collect_forwards_{reuse}"] = len(forwards)
    handle.remove()
    results = {}
    data = data_by_path[False]
    # The same advantages on every rank: after the exchange each rank holds the whole step's batch.
    data.advantages = torch.randn(len(data.sequences), generator=torch.Generator().manual_seed(7))
    (mini,) = data.mini_batches
    out["micro_batches_per_rank"] = len(mini.plan.ranks[rank])
    with trainer.actor.train_mode():
        metrics_old = trainer.actor.forward_backward_batch(data.micro_batches(mini), trainer.loss_fn)
        grads_old = _full_grads(trainer.actor.module)
        trainer.actor.zero_grad()
        data.old_log_probs = None
        metrics_new = trainer.actor.forward_backward_batch(data.micro_batches(mini), trainer.loss_fn)
        grads_new = _full_grads(trainer.actor.module)
        trainer.actor.zero_grad()
    results["grad_max_diff"] = max((a - b).abs().max().item() for a, b in zip(grads_old, grads_new, strict=True))
    results["loss_old_new"] = (metrics_old["loss"], metrics_new["loss"])
    out.update(results)

    # -- every loss_agg mode: gradients over 2 packed micro-batches x 2 ranks equal a hand-computed global loss --
    out["agg_max_rel_diff"] = {}
    for mode in LOSS_AGG_MODES:
        trainer.config.algorithm.loss_agg = mode
        trainer.reconfigure()  # the loss terms are built once
        with trainer.actor.train_mode():
            trainer.actor.forward_backward_batch(data.micro_batches(mini), trainer.loss_fn)
            got = _full_grads(trainer.actor.module)
            trainer.actor.zero_grad()
        want = _hand_reference_grads(trainer, data, mode)
        scale = max(w.abs().max().item() for w in want)
        out["agg_max_rel_diff"][mode] = max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) / scale

    # -- LoRA + KL: the reference is the actor's base with adapters disabled, not a second copy -------------------
    # Padded micro-batches here: the packing probe's forward at start-up would leave FSDP2's root unsharded (as any
    # forward-only pass does) and spoil the count of base weights below; packed LoRA is tested in test_packing_ranks.
    lora = _trainer(tmp, model_dir, data_path, "engine.lora_rank=4", "algorithm.kl_loss_coef=0.01",
                    "train.padding_free=false")
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
    from engine.rl.batches import gather_step_data, rank_sequences
    from engine.rl.logprobs import planned_log_probs

    lora_data = gather_step_data(rank_sequences(lora_batch, torch.zeros(len(lora_batch))), lora.batching, rank,
                                 dist.get_world_size(), torch.device("cpu"))
    with lora.actor.eval_mode():
        actor_lp = planned_log_probs(lora.actor, lora_data, 0.9, "old")
    ref_lp = lora.reference_log_probs(lora_data)
    mine = sorted(i for micro in lora_data.mini_batches[0].plan.ranks[rank] for i in micro)  # this rank's share
    with torch.no_grad():
        base = _full_model(lora.config.model)
        diffs = {"ref": [], "actor": []}
        for i in mine:
            start, end = int(lora_data.sequences.starts[i]), int(lora_data.sequences.lengths[i])
            ids = lora_data.sequences.tokens[i, :end]
            want = torch.log_softmax(base(input_ids=ids[None]).logits[0, start - 1:end - 1] / 0.9, -1)
            want = want.gather(-1, ids[start:end, None])[:, 0]
            diffs["ref"].append((ref_lp[i, :end - start] - want).abs().max().item())
            diffs["actor"].append((actor_lp[i, :end - start] - want).abs().max().item())
    out["ref_vs_base"] = max(diffs["ref"])
    out["actor_vs_base"] = max(diffs["actor"])
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


@pytest.fixture(scope="module")
def outs(fixture_dirs):
    """Every rank's results of the one spawn; each test below checks one property of them."""
    root, model_dir, greedy_dir, data_path = fixture_dirs
    return run_ranks(_checks, str(root / "run"), str(model_dir), str(greedy_dir), str(data_path),
                     env={"ACCEL_BACKENDS_PLUGINS": "rollout_copy_plugin"})


def test_process_group_timeout_comes_from_the_config(outs):
    for out in outs:
        assert out["timeout_s"] == 77.0


def test_prompts_use_the_chat_template_sampling_stops_at_both_eos_ids_and_every_engine_ran(outs):
    for out in outs:
        assert out["prompt_has_template"] and out["eos_ids"]
        assert set(out["engines"]) == set(ENGINES)


@pytest.mark.parametrize("name", ENGINES)
def test_engine_samples_from_the_trainers_distribution(outs, name):
    # Sampled from sampling_scores (temperature, top-k, top-p), not the model's greedy / penalised config, and the
    # trainer's log-probs are of that same distribution.
    for out in outs:
        engine = out["engines"][name]
        assert engine["on_policy_max_diff"] < 1e-4, (name, engine["on_policy_max_diff"])
        assert engine["distinct_in_group"] >= 2, name


@pytest.mark.parametrize("name", ENGINES)
def test_engine_masks_responses_after_their_first_eos(outs, name):
    for out in outs:
        engine = out["engines"][name]
        for first_eos, mask_length, width in engine["eos_ends"]:
            assert mask_length == (first_eos + 1 if first_eos is not None else width), (name, engine)
        assert any(first is not None for first, _, _ in engine["eos_ends"]), f"{name}: the EOS never came"
        assert engine["tokens"] > 2 * 8, (name, "responses too short to say anything")


def test_both_eos_ids_ended_responses(outs):
    # Over both ranks and every engine, both EOS ids ended responses.
    for out in outs:
        assert {kind for o in outs for e in o["engines"].values() for kind in e["eos_kinds"]} == set(out["eos_ids"])


def test_plugin_engine_copy_receives_exactly_the_trained_weights(outs):
    for out in outs:
        copy = out["copy_engine"]
        # At the start and after each of the 2 updates: every tensor, bit for bit, and the weights did change.
        assert copy["received"] == copy["expected"] and len(copy["received"]) == 3
        first, second, third = copy["expected"]
        assert first != second and second != third and first != third  # each update changed the weights
        assert copy["own_equals_actor"]


def test_reusing_the_policy_log_probs_skips_the_old_log_prob_forward(outs):
    # Old path: one log-prob forward per micro-batch of this rank (8 sequences over 2 ranks, 2 per micro-batch) in
    # collect; new path: none.
    for out in outs:
        assert out["micro_batches_per_rank"] == 2
        assert out["collect_forwards_False"] == 2 and out["collect_forwards_True"] == 0, out


def test_without_old_log_probs_the_gradients_and_loss_are_the_same(outs):
    for out in outs:
        assert out["grad_max_diff"] < 1e-5 and out["loss_old_new"][0] == pytest.approx(out["loss_old_new"][1],
                                                                                        abs=1e-6)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_loss_agg_mode_gradients_equal_a_hand_computed_global_loss(outs, mode):
    for rank, out in enumerate(outs):
        diff = out["agg_max_rel_diff"][mode]
        assert diff < 1e-4, (rank, mode, diff)


def test_lora_reference_is_the_actors_base_not_a_second_copy(outs):
    for out in outs:
        assert not out["lora_reference_engine"]
        local, full = out["base_numel_local_vs_full"]
        assert local <= full / 2 * 1.05, "more than one (sharded) copy of the base weights on a rank"


def test_lora_reference_log_probs_are_the_base_models(outs):
    for out in outs:
        assert out["ref_vs_base"] < 1e-5 and out["actor_vs_base"] > 1e-3, out
