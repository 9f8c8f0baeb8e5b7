"""accel-dpo's and accel-rm's losses are exact over the global batch on 2 real gloo ranks (FSDP2): split over the
two data-parallel ranks (packed within a token budget, and padded two pairs per micro-batch) and over one
sequence-parallel group of both ranks (packed), the loss, metrics and every gradient equal those of one plain
process computing all the pairs in one padded micro-batch (the formulas themselves: tests/unit/test_dpo_loss.py,
test_rm_loss.py). DPO's reference is a frozen engine of another model (so the implicit rewards are not zero), with
the RPO NLL term on; the reward model has margins and the centring term. The same spawn scores responses with a
trained reward model in RL's way (reward_model.path) sharded across both ranks, each rank a different number of
responses: the scores are the replicated model's. One spawn; each test asserts one property."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow

PAIRS = 12
VARIANTS = {"2 ranks, packed, 160-token budget": {"sp": 1, "packed": True, "micro_batch_tokens": 160},
            "2 ranks, padded, 2 pairs each": {"sp": 1, "packed": False, "micro_batch_tokens": None},
            "sp=2, packed, 1 micro-batch": {"sp": 2, "packed": True, "micro_batch_tokens": 4096}}
DPO = {"beta": 0.5, "rpo_alpha": 0.3}
RM = {"margin_key": "m", "center_rewards_coef": 0.1}


def _pairs(tokenizer):
    from engine.offline.pair_data import demo_pairs
    from engine.offline.pairs import tokenize_pair

    pairs = [tokenize_pair(p, tokenizer) for p in demo_pairs(PAIRS, seed=5)]
    for index, pair in enumerate(pairs):
        pair.margin = (index % 3 - 1) * 0.4
    return pairs


def _run(engine, micro_batches, loss_fn):
    from sft_reference import full_grads

    with engine.train_mode():
        result = engine.forward_backward_batch(micro_batches, loss_fn)
        grads = full_grads(engine.module)
        engine.zero_grad()
    return result, grads


def _compare(result, grads, want, names):
    from sft_reference import relative_error

    return {"pairs": result["weight"], "loss_error": abs(result["loss"] - want["loss"]) / abs(want["loss"]),
            "metric_error": max(abs(result[n] - want[n]) for n in names), "grad_error": relative_error(grads,
                                                                                                      want["grads"])}


def _one_process(model, micro, loss_fn, names):
    from sft_reference import full_grads

    loss, pairs, metrics = loss_fn(model, micro)
    loss.backward()
    return {"loss": loss.item(), "grads": full_grads(model), **{n: float(metrics[n]) for n in names}}


def _exactness(rank: int, policy_dir: str, reference_dir: str) -> dict:
    import functools

    import torch
    from transformers import AutoModelForCausalLM

    import accel_backends
    from engine import EngineConfig, FSDPEngine
    from engine.offline.model_files import load_tokenizer
    from engine.offline.objectives.dpo.config import DPOSettings
    from engine.offline.objectives.dpo.reference import Reference, sequence_log_probs
    from engine.offline.objectives.dpo.trainer import NAMES, dpo_loss, nll_scale
    from engine.offline.objectives.rm.config import RewardSettings
    from engine.offline.objectives.rm.loss import METRICS
    from engine.offline.objectives.rm.model import factory, scoring_pair
    from engine.offline.objectives.rm.trainer import reward_loss
    from engine.offline.pair_batches import rank_pair_micro_batches
    from engine.sequence_parallel import SequenceParallel

    cpu, one = torch.device("cpu"), SequenceParallel.single(0, 1)
    tokenizer = load_tokenizer(policy_dir)
    pairs = _pairs(tokenizer)
    rm_pairs = [scoring_pair(p) for p in pairs]
    dpo_settings, rm_settings = DPOSettings(**DPO), RewardSettings(**RM)
    scale = nll_scale(pairs)

    def whole(items):
        return rank_pair_micro_batches(items, 0, 1, micro_batch_tokens=None, micro_batch_size=PAIRS,
                                       packed=False)[0][0]

    # One plain process, every pair in one padded micro-batch.
    plain = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    plain_reference = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32)
    micro = whole(pairs)
    with torch.no_grad():
        micro.reference = sequence_log_probs(plain_reference, micro, one, cpu)
    want_dpo = _one_process(plain, micro, functools.partial(dpo_loss, device=cpu, sp=one, settings=dpo_settings,
                                                            nll_scale=scale), NAMES)
    build_rm = factory(policy_dir, 3, tokenizer.pad_token_id)
    want_rm = _one_process(build_rm(), whole(rm_pairs), functools.partial(reward_loss, device=cpu, sp=one,
                                                                          settings=rm_settings), METRICS)

    backend = accel_backends.get_backend()
    results = {"rewards_apart": abs(want_dpo["rewards/margins"]) > 1e-3, "rm_accuracy": want_rm["accuracy"]}
    engines = {}
    for name, variant in VARIANTS.items():
        sp = variant["sp"]
        if sp not in engines:
            options = {"fsdp_version": 2, "sequence_parallel_size": sp}
            policy = FSDPEngine(policy_dir, EngineConfig(**options), backend)
            frozen = FSDPEngine(reference_dir, EngineConfig(**options, frozen=True), backend)
            engines[sp] = (policy, Reference(policy, frozen), FSDPEngine(build_rm, EngineConfig(**options), backend))
        policy, reference, reward_model = engines[sp]
        group = policy.sequence_parallel
        plan = {"micro_batch_tokens": variant["micro_batch_tokens"], "micro_batch_size": 2, "packed": variant["packed"]}
        dpo_micro, figures = rank_pair_micro_batches(pairs, group.data_parallel_rank, group.data_parallel_size, **plan)
        reference.fill(dpo_micro, cpu)
        dpo = _run(policy, dpo_micro, functools.partial(dpo_loss, device=cpu, sp=group, settings=dpo_settings,
                                                        nll_scale=scale))
        rm_micro, _ = rank_pair_micro_batches(rm_pairs, group.data_parallel_rank, group.data_parallel_size, **plan)
        rm = _run(reward_model, rm_micro, functools.partial(reward_loss, device=cpu, sp=group, settings=rm_settings))
        results[name] = {"micro_batches": figures["micro_batches"], "pad_tokens": figures["pad_tokens"],
                         "dpo": _compare(*dpo, want_dpo, NAMES), "rm": _compare(*rm, want_rm, METRICS)}
    return results


def _sharded_scores(rank: int, reward_model_dir: str) -> dict:
    """reward_model.path's scores of this rank's responses (rank 0: 5, rank 1: 2; batches of 2, so 3 forwards
    and 1), from a replicated copy and from the model sharded across both ranks (FSDP2)."""
    import dataclasses

    import accel_backends
    from engine.rl.algorithms.grpo.config import GRPOConfig
    from engine.rl.engine_settings import reward_model_engine
    from engine.rl.prompt_types import Sample
    from engine.rl.scorers import ClassifierReward

    config = GRPOConfig()
    config.engine = {"fsdp_version": 2}
    backend = accel_backends.get_backend()
    responses = ["aab", "ba", "aaaa", "b", "abab"] if rank == 0 else ["a", "bbba"]
    samples = [Sample(prompt="b x2:")] * len(responses)
    scores = {}
    for sharding in ("replicated", "sharded"):
        section = dataclasses.replace(config.reward_model, path=reward_model_dir, batch_size=2, sharding=sharding)
        fn = ClassifierReward(section, backend, reward_model_engine(config, section))
        scores[sharding] = {"engine": fn.engine is not None, "scores": fn.score(samples, responses, None)}
    return scores


def _spawned(rank: int, policy_dir: str, reference_dir: str, reward_model_dir: str) -> dict:
    return {**_exactness(rank, policy_dir, reference_dir), "scoring": _sharded_scores(rank, reward_model_dir)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from reward_models import make_reward_model

    from engine.demo_model import make_tiny_model

    root = tmp_path_factory.mktemp("preference-ranks")
    policy = make_tiny_model(root / "policy", vocab_size=512, seed=0)
    reference = make_tiny_model(root / "reference", vocab_size=512, seed=1)
    reward_model = make_reward_model(root / "reward-model")
    return run_ranks(_spawned, str(policy), str(reference), str(reward_model), world_size=2)


def test_the_reference_differs_from_the_policy_and_the_reward_model_is_not_trivial(results):
    assert results[0]["rewards_apart"]
    assert 0 < results[0]["rm_accuracy"] < 1


@pytest.mark.parametrize("recipe", ["dpo", "rm"])
@pytest.mark.parametrize("name", VARIANTS)
def test_loss_metrics_and_gradients_equal_one_process(results, name, recipe):
    for result in results:
        got = result[name][recipe]
        assert got["pairs"] == PAIRS, got  # each pair counted once, whatever the split
        assert got["loss_error"] <= 1e-5, got
        assert got["metric_error"] <= 1e-5, got
        assert got["grad_error"] <= 1e-5, got


def test_the_splits_are_what_they_claim(results):
    packed, padded = (results[0][name] for name in list(VARIANTS)[:2])
    assert packed["micro_batches"] > 1 and packed["pad_tokens"] == 0
    assert padded["micro_batches"] == PAIRS / 2 / 2 and padded["pad_tokens"] > 0


def test_a_sharded_reward_model_scores_as_a_replicated_one(results):
    for rank, result in enumerate(results):
        scoring = result["scoring"]
        assert not scoring["replicated"]["engine"] and scoring["sharded"]["engine"]  # two ways, really
        assert len(scoring["sharded"]["scores"]) == (5 if rank == 0 else 2)  # rank 1 ran 2 filler forwards
        assert scoring["sharded"]["scores"] == pytest.approx(scoring["replicated"]["scores"], abs=1e-5)
        assert max(scoring["sharded"]["scores"]) > min(scoring["sharded"]["scores"]) + 0.1  # not all the same
