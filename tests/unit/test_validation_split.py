"""data.val_fraction holds out the same rows for every trainer (issue 47): the frame's ``split_validation``, the rows
RL always held out, for RL, SFT, DPO and reward models alike; the built-in demos keep their own rows (their figures
are unchanged); validation is due by the frame's ``should_validate``."""

import pytest
from grpo_data import write_jsonl

from engine.demo_model import build_tokenizer
from engine.offline.objectives.sft.config import DataConfig
from engine.offline.objectives.sft.dataset import build_data
from engine.offline.pair_data import PairDataConfig, build_pairs
from engine.train.validation import should_validate, split_validation

HELD = [1, 3, 6, 7, 12]  # the rows RL's split held out of 20 at 0.25 with seed 3 before the frame owned it


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(512)


def test_the_frames_split_keeps_the_rows_rl_held_out():
    import engine.rl.prompts

    train, val = split_validation(list(range(20)), 0.25, 3)
    assert val == HELD and train == [i for i in range(20) if i not in HELD]
    assert engine.rl.prompts.split_validation is split_validation  # RL's call site is the frame's function
    with pytest.raises(ValueError, match="data.val_fraction=0.99 leaves no training rows out of 20"):
        split_validation(list(range(20)), 0.99, 3)


def test_sft_and_pairs_hold_out_the_same_rows_as_rl(tmp_path, tokenizer):
    user = [{"role": "user", "content": "how many apples?"}]
    examples = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": f"q {i}", "completion": f"a {i}"} for i in range(20)])
    sft = build_data(DataConfig(path=str(examples), val_fraction=0.25), "auto", tokenizer, seed=3)
    assert [item.where for item in sft.val] == [f"{examples}:{i + 1}" for i in HELD]
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": user, "chosen": [{"role": "assistant", "content": f"{i} apples"}],
         "rejected": [{"role": "assistant", "content": f"{i + 50} apples"}]} for i in range(20)])
    data = build_pairs(PairDataConfig(path=str(pairs), val_fraction=0.25), tokenizer, seed=3)
    assert [pair.where for pair in data.val] == [f"{pairs}:{i + 1} (chosen)" for i in HELD]


def test_the_demos_keep_their_held_out_rows(tokenizer):
    pairs = build_pairs(PairDataConfig(demo_pairs=64), tokenizer, seed=0)
    assert [p.where for p in pairs.val] == [f"demo:{n} (chosen)" for n in (25, 29, 30, 34, 36, 61)]
    sft = build_data(DataConfig(demo_examples=200), "auto", tokenizer, seed=0)
    assert [e.where for e in sft.val] == [f"demo:{n}" for n in (23, 93, 132, 145, 173, 182)]


def test_validation_is_due_every_n_steps_and_after_the_last():
    assert [s for s in range(10) if should_validate(s, 10, 4)] == [3, 7, 9]
    assert [s for s in range(10) if should_validate(s, 10, 0)] == [9]
    assert not should_validate(5, None, 0)
