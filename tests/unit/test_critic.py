"""engine/rl/algorithms/ppo/critic.py: PPO's critic (a value head on the policy's architecture), its values at the
response positions (packed = padded = one sequence at a time) and the clipped value loss against its formula."""

import pytest
import torch

from engine.packing import SequenceBatch, build_layout
from engine.rl.algorithms.ppo.critic import critic_factory, token_values, value_loss
from engine.tiny_model import tiny_qwen2


def _policy():
    return tiny_qwen2(seed=3, vocab_size=20, hidden_size=16, layers=1, heads=2, kv_heads=1)


def test_the_critic_is_the_policys_transformer_with_a_value_head():
    critic, policy = critic_factory(_policy, seed=1)(), _policy()
    assert critic.score.weight.shape == (1, 16)
    for (name, mine), (_, theirs) in zip(critic.model.state_dict().items(), policy.model.state_dict().items(),
                                         strict=True):
        assert torch.equal(mine, theirs), name


def test_the_critics_values_are_not_a_view_so_fsdp2_has_no_warning_to_give():
    """Issue 45 (7d): every accel-ppo run printed FSDP2's "returned a view tensor ... wrong gradients" warning
    twice: the value head (a Linear with a bias, on a 3-d input) returns a view of its 2-d result."""
    critic = critic_factory(_policy, seed=1)().eval()  # no dropout: the values compare below
    logits = critic(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.requires_grad and logits._base is None
    hidden = critic.model(input_ids=torch.tensor([[1, 2, 3]])).last_hidden_state
    torch.testing.assert_close(logits, torch.nn.functional.linear(critic.dropout(hidden), critic.score.weight,
                                                                  critic.score.bias))


@pytest.mark.parametrize("packed", [True, False])
def test_values_are_read_where_each_response_token_was_chosen(packed):
    critic = critic_factory(_policy, seed=1)().eval()
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6])]
    responses = [torch.tensor([7, 8]), torch.tensor([9, 10, 11, 12]), torch.tensor([13])]
    batch = SequenceBatch.from_parts(prompts, responses)
    with torch.no_grad():
        values = token_values(critic, build_layout(batch, [0, 1, 2], packed))
        assert values.shape == (3, 4)
        for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            alone = critic(input_ids=torch.cat([prompt, response]).unsqueeze(0)).logits[0, :, 0]
            want = alone[len(prompt) - 1:len(prompt) + len(response) - 1]  # the position before each token
            torch.testing.assert_close(values[row, :len(response)], want, rtol=1e-5, atol=1e-6)
            assert not values[row, len(response):].any()


def test_value_loss_against_its_formula():
    torch.manual_seed(0)
    values, old, returns = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, clip_range=0.2)
    per_token, clipped = [], 0
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                v, o, r = values[b, t].item(), old[b, t].item(), returns[b, t].item()
                held = min(max(v, o - 0.2), o + 0.2)
                per_token.append(max((v - r) ** 2, (held - r) ** 2))
                clipped += (held - r) ** 2 > (v - r) ** 2
    assert loss.item() == pytest.approx(0.5 * sum(per_token) / len(per_token), rel=1e-6)
    assert metrics["vf_clip_frac"] == pytest.approx(clipped / len(per_token))
    unclipped, _ = value_loss(values, old, returns, mask, clip_range=None)
    assert unclipped.item() == pytest.approx(0.5 * (((values - returns) ** 2) * mask).sum().item() / mask.sum().item())


def test_the_critics_own_micro_batches_keep_each_ranks_sequences_and_match_in_count():
    """critic.micro_batch_size / micro_batch_tokens: each rank's sequences of the policy's plan (whose values and
    returns that rank computed) planned again within the critic's sizes; as many micro-batches on every rank."""
    from engine.rl.algorithms.ppo.critic import own_micro_batches

    lengths = [5, 3, 4, 6, 2]
    policy = (((0, 1), (2,)), ((3, 4), ()))  # rank 0: sequences 0, 1, 2; rank 1: 3, 4 (and a filler)
    for limits in ({"max_sequences": 1, "max_tokens": None}, {"max_sequences": None, "max_tokens": 8},
                   {"max_sequences": 16, "max_tokens": None}):
        for padded in (False, True):
            ranks = own_micro_batches(policy, lengths, padded=padded, **limits)
            assert len({len(micro_batches) for micro_batches in ranks}) == 1, ranks  # FSDP: the same count
            for own, micro_batches in zip(policy, ranks, strict=True):
                assert sorted(i for micro in micro_batches for i in micro) == sorted(i for m in own for i in m)
                for micro in micro_batches:
                    if limits["max_sequences"]:
                        assert len(micro) <= limits["max_sequences"]
                    else:
                        load = len(micro) * max(lengths[i] for i in micro) if padded and micro else \
                            sum(lengths[i] for i in micro)
                        assert load <= limits["max_tokens"], (micro, padded)
    one = own_micro_batches(policy, lengths, max_sequences=1, max_tokens=None, padded=False)
    assert [len(micro_batches) for micro_batches in one] == [3, 3] and one[1][2] == ()  # rank 1 pads with a filler
    whole = own_micro_batches(policy, lengths, max_sequences=16, max_tokens=None, padded=False)
    assert [[sorted(micro) for micro in r] for r in whole] == [[[0, 1, 2]], [[3, 4]]]  # larger: fewer of them


def test_the_critics_micro_batch_keys_are_checked_before_any_worker():
    from engine.rl.algorithms.ppo.checks import algorithm_problems
    from engine.rl.algorithms.ppo.schema import PPOConfig

    config = PPOConfig()
    assert algorithm_problems(config) == []
    config.critic.micro_batch_size, config.critic.micro_batch_tokens = 0, 8
    found = " | ".join(algorithm_problems(config))
    assert "critic.micro_batch_size must be a positive integer or null (the policy's), got 0" in found
    assert "critic.micro_batch_tokens needs data.max_prompt_tokens" in found
    config.critic.micro_batch_size, config.data.max_prompt_tokens = None, 64
    assert algorithm_problems(config) == [f"critic.micro_batch_tokens=8 is smaller than the longest possible sequence, "
                                          f"{64 + config.rollout.max_new_tokens} tokens: raise it to at least that"]


def _critic_dir(directory, vocab_size: int, alphabet: str | None = None):
    """A critic directory as the launcher reads it: config.json (and, with ``alphabet``, a tokenizer of its own)."""
    import json

    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                                                       "vocab_size": vocab_size, "hidden_size": 16}))
    if alphabet is not None:
        from engine.rl.tokenizer import build_char_tokenizer

        build_char_tokenizer(alphabet).save_pretrained(directory)
    return directory


def test_critic_path_is_refused_in_one_line_before_any_worker(tmp_path, capsys):
    """Issue 45: a missing critic.path ended in a Hub lookup that never named the key, another vocabulary in an
    IndexError inside a worker; each is now one line naming critic.path, before the run directory exists."""
    from engine.rl.algorithms.ppo import cli

    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text('{"model_type": "no-such-model"}')
    cases = {tmp_path / "missing": "does not exist: give a model directory",
             unknown: "unknown architecture (model_type 'no-such-model')",
             _critic_dir(tmp_path / "small", 5): "has 5 token embeddings but the policy's tokenizer has",
             _critic_dir(tmp_path / "other", 200, alphabet="xyz"): "has a tokenizer that differs from the policy's"}
    for path, said in cases.items():
        status = cli.main([f"critic.path={path}", f"run.output_dir={tmp_path / 'runs'}", "run.name=refused"])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1 and f"critic.path {path}" in err[0] and said in err[0], err
    assert not (tmp_path / "runs").exists()


def test_resume_refuses_a_changed_critic_path(tmp_path):
    from engine.train.registry import get_recipe
    from engine.train.resume import changes, refusal

    ppo = get_recipe("ppo")

    recorded = {"critic": {"path": str(tmp_path / "a"), "lr": 1e-5}}
    line = refusal(tmp_path, changes(recorded, {"critic": {"path": str(tmp_path / "b"), "lr": 1e-5}},
                                     ppo.path_keys), ppo.resume_fixed)
    assert line is not None and f"critic.path={tmp_path / 'b'} would change the critic the checkpoint holds" in line
    assert refusal(tmp_path, changes(recorded, {"critic": {"path": str(tmp_path / "a"), "lr": 2e-5}},
                                     ppo.path_keys), ppo.resume_fixed) is None  # its lr may change
