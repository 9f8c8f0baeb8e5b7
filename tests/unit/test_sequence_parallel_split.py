"""engine/sequence_parallel: the token-axis split (slices own each scored token once, predictors and targets
intact), the sequences attention rebuilds from positions, the ulysses function's local path against packed_sdpa,
and the one-line refusals."""

import dataclasses
import types

import pytest
import torch

from engine import EngineConfig
from engine.packing import SequenceBatch, build_layout, register_packed_sdpa
from engine.sequence_parallel import (
    SplitForward,
    config_problems,
    model_problems,
    module_problems,
    register_ulysses,
    shift_labels,
    split_inputs,
    split_layout,
    token_mean_share,
)
from engine.sequence_parallel.attention import segments
from engine.tiny_model import tiny_qwen2

VOCAB = 50


def _group(size, rank):
    """A group as the split sees it (no process group is needed to cut)."""
    return types.SimpleNamespace(enabled=size > 1, size=size, rank=rank)


def _layout(packed, lengths=(9, 4, 12), starts=(3, 1, 7)):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, VOCAB, (len(lengths), max(lengths)), generator=g)
    return build_layout(SequenceBatch(tokens, torch.tensor(lengths), torch.tensor(starts)),
                        list(range(len(lengths))), packed=packed)


def _predictors(layout):
    """The input token at each scored token's predictor position, in targets order."""
    return layout.select(layout.inputs["input_ids"][:, layout.logits_to_keep])


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_slices_own_every_scored_token_once_with_its_predictor_and_target(packed, size):
    layout = _layout(packed)
    values = torch.arange(1.0, layout.targets.numel() + 1)
    owned, rows = [], torch.zeros(layout.sequences, layout.width)
    for rank in range(size):
        piece = split_layout(layout, _group(size, rank))
        assert piece.inputs["input_ids"].size(1) * size == piece.inputs["sequence_parallel"].positions.size(1)
        assert "attention_mask" not in piece.inputs
        assert torch.equal(piece.targets, layout.targets[piece.owned])
        assert torch.equal(_predictors(piece), _predictors(layout)[piece.owned])
        assert piece.group_tokens == layout.targets.numel()
        rows += piece.to_rows(values[piece.owned]) * piece.scored_mask
        owned.append(piece.owned)
    assert torch.equal(torch.sort(torch.cat(owned)).values, torch.arange(layout.targets.numel()))
    assert torch.equal(rows, layout.to_rows(values))


def test_positions_and_ids_are_the_rows_cut_in_rank_order_padded_at_the_end():
    layout = _layout(True)  # 25 tokens in one row: 1 filler at the end for 2 ranks
    pieces = [split_layout(layout, _group(2, r)) for r in range(2)]
    ids = torch.cat([p.inputs["input_ids"] for p in pieces], dim=1)
    positions = torch.cat([p.inputs["position_ids"] for p in pieces], dim=1)
    assert torch.equal(ids[:, :25], layout.inputs["input_ids"]) and ids.size(1) == 26
    assert torch.equal(positions[:, :25], layout.inputs["position_ids"]) and positions[0, 25] == 12  # continues
    assert torch.equal(positions, pieces[0].inputs["sequence_parallel"].positions)
    assert [p.real_tokens for p in pieces] == [13, 12]


def test_a_rank_without_scored_tokens_keeps_a_masked_stand_in():
    layout = _layout(True, lengths=(8,), starts=(6,))  # predictors at positions 5 and 6: both on rank 1 of 2
    empty = split_layout(layout, _group(2, 0))
    assert empty.owned.numel() == 0 and empty.targets.numel() == 1
    assert int(empty.scored_mask.sum()) == 0
    values = torch.tensor([2.0], requires_grad=True)
    share = token_mean_share(values, empty)
    share.backward()
    assert share.item() == 0.0 and values.grad is not None
    full = split_layout(layout, _group(2, 1))
    assert token_mean_share(torch.tensor([1.0, 3.0]), full).item() == 2.0


def test_split_is_the_layout_itself_without_a_group():
    layout = _layout(False)
    assert split_layout(layout, _group(1, 0)) is layout


def test_labels_are_shifted_before_the_cut():
    labels = torch.tensor([[-100, 5, 6, 7, 8]])
    assert shift_labels(labels).tolist() == [[5, 6, 7, 8, -100]]
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    parts = [split_inputs(ids, labels, _group(2, r)) for r in range(2)]
    assert [p[1].tolist() for p in parts] == [[[5, 6, 7]], [[8, -100, -100]]]  # rank 0's last target is rank 1's
    assert parts[1][0]["position_ids"].tolist() == [[3, 4, 5]]
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    inputs, targets = split_inputs(ids, torch.tensor([[9, 9, 3, 4, 5]]), _group(1, 0), attention_mask=mask)
    assert inputs["position_ids"].tolist() == [[0, 0, 0, 1, 2]] and targets.tolist() == [[-100, 3, 4, 5, -100]]


def test_sequences_come_from_positions():
    assert segments(torch.tensor([[0, 1, 2, 3]])) is None
    assert segments(torch.tensor([[0, 1, 0, 1, 2, 0]])).tolist() == [[0, 0, 1, 1, 1, 2]]
    assert segments(torch.tensor([[0, 0, 0, 1], [0, 1, 2, 3]])).tolist() == [[0, 1, 2, 2], [0, 0, 0, 0]]


class _OneRank:
    """A group of one whose exchange is a copy: the ulysses function's local attention, in process."""

    enabled, size, rank, group = True, 1, 0, None

    class backend:  # noqa: N801 - a stand-in namespace
        @staticmethod
        def all_to_all(output, input, group=None):
            output.copy_(input)


@pytest.mark.parametrize("case", ["packed", "left-padded"])
def test_ulysses_attention_equals_packed_sdpa_on_whole_sequences(case):
    torch.manual_seed(0)
    reference = tiny_qwen2(seed=0, vocab_size=VOCAB, hidden_size=32, heads=4, kv_heads=1).eval()
    reference.set_attn_implementation(register_packed_sdpa())
    split = tiny_qwen2(seed=0, vocab_size=VOCAB, hidden_size=32, heads=4, kv_heads=1).eval()
    split.set_attn_implementation(register_ulysses())
    ids = torch.randint(1, VOCAB, (3, 10))
    if case == "packed":
        ids, positions, mask = ids[:1], torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]]), None
    else:
        mask = torch.ones_like(ids)
        mask[0, :4], mask[2, :1] = 0, 0
        positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        want = reference(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False).logits
        got = split(input_ids=ids, position_ids=positions, use_cache=False,
                    sequence_parallel=SplitForward(_OneRank, positions)).logits
        whole = split(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False).logits
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    assert torch.allclose(got[real], want[real], atol=1e-5)
    assert torch.allclose(whole[real], want[real], atol=1e-6)  # no sequence_parallel: packed_sdpa, masks included


def _config(**kw):
    fields = dict(num_attention_heads=4, layer_types=["full_attention"] * 2)
    return types.SimpleNamespace(**{**fields, **kw})


FACTS = types.SimpleNamespace(unsupported=None, head_multiple=1)


@pytest.mark.parametrize("problems, words", [
    (lambda: config_problems(3, 4), "sequence_parallel_size=3 does not divide the world size 4: use one of 1, 2, 4"),
    (lambda: config_problems(2, 2, attn_implementation="eager"), "leave attn_implementation unset"),
    (lambda: model_problems(3, _config(), FACTS), "does not divide the model's 4 attention heads: use one of 1, 2, 4"),
    (lambda: model_problems(2, _config(num_attention_heads=None), FACTS), "no num_attention_heads"),
    (lambda: model_problems(2, _config(layer_types=["sliding_attention"]), FACTS), "sliding_attention layers"),
    (lambda: model_problems(2, _config(layer_types=None, use_sliding_window=True, sliding_window=64), FACTS),
     "sliding_attention layers"),
    (lambda: model_problems(2, _config(num_attention_heads=8), dataclasses.replace(
        __import__("accel_backends").SequenceParallelFacts(), head_multiple=8)), "a multiple of 8"),
    (lambda: model_problems(2, _config(), types.SimpleNamespace(unsupported="no all-to-all", head_multiple=1)),
     "cannot run on this device: no all-to-all"),
    (lambda: module_problems(2, torch.nn.Linear(2, 2)), "Linear does not call transformers' registered attention"),
])
def test_what_cannot_be_split_is_one_line_naming_the_value(problems, words):
    found = list(problems())
    assert len(found) == 1 and words in found[0] and "\n" not in found[0], found


def test_splittable_settings_have_no_problem():
    assert list(config_problems(2, 4, fsdp_version=1)) == []
    assert list(model_problems(4, _config(), FACTS)) == []
    assert list(model_problems(1, None, FACTS)) == []
    assert list(module_problems(2, tiny_qwen2(vocab_size=VOCAB, hidden_size=32))) == []


@pytest.mark.parametrize("value, words", [
    (0, "sequence_parallel_size must be a whole number >= 1, got 0"),
    (1.5, "got 1.5"),
    (True, "got True"),
])
def test_engine_config_refuses_a_bad_size(value, words):
    with pytest.raises(ValueError, match="invalid EngineConfig: ") as error:
        EngineConfig(sequence_parallel_size=value)
    assert words in str(error.value)


def test_engine_config_refuses_another_attention_with_sequence_parallelism():
    with pytest.raises(ValueError, match="runs its own attention"):
        EngineConfig(sequence_parallel_size=2, attn_implementation="flash_attention_2")
    assert EngineConfig(sequence_parallel_size=2).sequence_parallel_size == 2


GRPO_REFUSALS = {
    "a size that does not divide the ranks": (
        ["engine.sequence_parallel_size=4"],
        "engine.sequence_parallel_size=4 does not divide the world size 2: use one of 1, 2"),
    "prompts that do not divide over the groups": (
        ["--nproc", "4", "engine.sequence_parallel_size=2", "train.prompts_per_step=3"],
        "train.prompts_per_step=3 does not divide over 2 data-parallel groups (4 ranks / "
        "engine.sequence_parallel_size=2)"),
    "colocated vLLM": (
        ["engine.sequence_parallel_size=2", "rollout.engine=vllm"],
        "engine.sequence_parallel_size=2 with rollout.engine=vllm in colocate mode is not supported"),
}


@pytest.mark.parametrize("case", GRPO_REFUSALS)
def test_grpo_refuses_a_split_it_cannot_run_before_any_worker(case, capsys, tmp_path):
    """accel-grpo trains on slices (tests/test_grpo_sequence_parallel.py); what it cannot do with them is said
    before any worker starts, in one line (colocated vLLM: among vLLM's own problems, one line each)."""
    from engine.rl.algorithms.grpo.cli import main

    args, words = GRPO_REFUSALS[case]
    code = main(["--preset", "cpu-demo", *args, f"run.output_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err, err
    assert "\n" not in err or "vllm" in case.lower(), err
    assert not (tmp_path / "runs").exists()


def test_sft_refuses_a_group_size_that_does_not_divide_its_ranks(capsys, tmp_path):
    """accel-sft splits sequences; a size that does not divide the world is one line before any worker starts."""
    from engine.offline.objectives.sft.cli import main

    code = main(["--preset", "cpu-demo", "engine.sequence_parallel_size=4", f"run.output_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert "engine.sequence_parallel_size=4 does not divide the world size 2: use one of 1, 2" in err
    assert not (tmp_path / "runs").exists()
