"""Preference pairs in TRL's formats (engine/offline/pairs.py, pair_data.py): explicit prompts as text or
conversations, the implicit-prompt form (the prefix chosen and rejected share), JSONL / Parquet / datasets
directories; each response scored on its own tokens after the prompt; too-long and equal pairs dropped and counted;
every bad row named in one line; and a pair's two sequences always in one micro-batch."""

import json

import pytest
from grpo_data import write_datasets_dir, write_jsonl, write_parquet

from engine.demo_model import build_tokenizer
from engine.offline.messages import DataError
from engine.offline.pair_batches import pair_loads, rank_pair_micro_batches
from engine.offline.pair_data import PairDataConfig, build_pairs, demo_pairs
from engine.offline.pairs import PairColumns, load_pairs, to_pair, tokenize_pair

USER = [{"role": "user", "content": "how many apples"}]
GOOD = [{"role": "assistant", "content": "12 apples"}]
BAD = [{"role": "assistant", "content": "7 apples"}]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(512)


def _scored(tokenizer, item) -> str:
    return tokenizer.decode([t for t, m in zip(item.ids, item.mask, strict=True) if m])


def test_explicit_and_implicit_conversations_give_the_same_tokens(tokenizer):
    columns = PairColumns()
    explicit = to_pair({"prompt": USER, "chosen": GOOD, "rejected": BAD}, columns, "f:1")
    implicit = to_pair({"chosen": USER + GOOD, "rejected": USER + BAD}, columns, "f:2")
    assert implicit.implicit and not explicit.implicit
    assert implicit.prompt == USER and implicit.chosen == GOOD and implicit.rejected == BAD
    a, b = tokenize_pair(explicit, tokenizer), tokenize_pair(implicit, tokenizer)
    assert (a.chosen.ids, a.chosen.mask, a.rejected.ids) == (b.chosen.ids, b.chosen.mask, b.rejected.ids)
    # The response and its end of turn are scored; the prompt, the header and the template's newline are not.
    assert _scored(tokenizer, a.chosen) == "12 apples<|im_end|>"
    assert _scored(tokenizer, a.rejected) == "7 apples<|im_end|>"
    prompt_tokens = a.chosen.mask.index(1)
    assert a.chosen.ids[:prompt_tokens] == a.rejected.ids[:prompt_tokens]


def test_text_pairs_get_the_eos_and_an_implicit_text_prompt_is_the_shared_characters(tokenizer):
    columns = PairColumns()
    pair = tokenize_pair(to_pair({"prompt": "Q: sky?", "chosen": " blue", "rejected": " green"}, columns, "f:1"),
                         tokenizer)
    assert _scored(tokenizer, pair.chosen) == " blue<|im_end|>"
    implicit = to_pair({"chosen": "Q: sky? blue", "rejected": "Q: sky? green"}, columns, "f:2")
    assert (implicit.prompt, implicit.chosen, implicit.rejected) == ("Q: sky? ", "blue", "green")


def test_files_of_every_kind_read_alike(tmp_path):
    rows = [{"prompt": USER, "chosen": GOOD, "rejected": BAD, "score": 0.5}] * 3
    columns = PairColumns(margin="score")
    for path in (write_jsonl(tmp_path / "p.jsonl", rows), write_parquet(tmp_path / "p.parquet", rows),
                 write_datasets_dir(tmp_path / "p-dir", rows)):
        pairs = load_pairs(str(path), columns)
        assert [(p.prompt, p.chosen, p.rejected, p.margin) for p in pairs] == [(USER, GOOD, BAD, 0.5)] * 3


@pytest.mark.parametrize("row, says", [
    ({"prompt": USER, "chosen": GOOD}, "f:7: no column 'rejected' (columns: chosen, prompt): set data.rejected_key="),
    ({"prompt": USER, "chosen": GOOD, "rejected": "7 apples"}, "both be text or both be message lists"),
    ({"prompt": "how many", "chosen": GOOD, "rejected": BAD}, "conversational responses need a conversational prompt"),
    ({"prompt": USER, "chosen": [{"role": "robot", "content": "x"}], "rejected": BAD}, "has role 'robot'"),
    ({"chosen": GOOD, "rejected": BAD}, "share no first message, so the prompt cannot be found"),
    ({"chosen": USER + GOOD, "rejected": USER}, "one of chosen and rejected is the other's beginning"),
    ({"prompt": USER, "chosen": GOOD, "rejected": BAD, "score": "high"}, "the margin 'score' must be a finite number"),
    ({"prompt": USER, "chosen": GOOD, "rejected": BAD}, "no margin column 'score'"),
])
def test_a_bad_row_is_named_in_one_line(row, says):
    with pytest.raises(DataError) as caught:
        to_pair(row, PairColumns(margin="score") if "margin" in says or "score" in row else PairColumns(), "f:7")
    message = str(caught.value)
    assert message.startswith("f:7: ") and says in message and "\n" not in message


def test_a_response_without_an_assistant_turn_names_its_side(tokenizer):
    pair = to_pair({"prompt": USER, "chosen": GOOD, "rejected": [{"role": "user", "content": "hm"}]},
                   PairColumns(), "f:3")
    with pytest.raises(DataError, match=r"^f:3 \(rejected\): the completion has no assistant message"):
        tokenize_pair(pair, tokenizer)


def test_data_sets_split_drop_and_count(tmp_path, tokenizer):
    rows = [{"prompt": USER, "chosen": GOOD, "rejected": BAD}] * 8
    rows.append({"prompt": USER, "chosen": GOOD, "rejected": GOOD})  # nothing to prefer
    rows.append({"prompt": USER, "chosen": [{"role": "assistant", "content": "a b c d e f g h " * 20}],
                 "rejected": BAD})  # too long
    config = PairDataConfig(path=str(write_jsonl(tmp_path / "d.jsonl", rows)), max_length=80, truncation="drop",
                            val_fraction=0.25)
    data = build_pairs(config, tokenizer, seed=0)
    assert (len(data.train) + len(data.val), data.equal, data.dropped) == (8, 1, 1)
    assert data.summary().endswith("1 dropped as too long for data.max_length, 1 dropped with chosen equal to "
                                   "rejected")
    with pytest.raises(DataError, match=r"d.jsonl:10 \(chosen\): \d+ tokens, above data.max_length=80"):
        build_pairs(PairDataConfig(path=config.path, max_length=80, truncation="error"), tokenizer, seed=0)
    mixed = write_jsonl(tmp_path / "m.jsonl", [rows[0], {"prompt": "q", "chosen": "a", "rejected": "b"}])
    with pytest.raises(DataError, match="m.jsonl:2: its responses are text, unlike the first row's"):
        build_pairs(PairDataConfig(path=str(mixed)), tokenizer, seed=0)


def test_a_pairs_two_sequences_share_a_micro_batch(tokenizer):
    pairs = [tokenize_pair(p, tokenizer) for p in demo_pairs(24, seed=1)]
    for packed in (True, False):
        budget = 3 * max(pair_loads(pairs, packed))
        seen = []
        for rank in (0, 1):
            micro_batches, figures = rank_pair_micro_batches(pairs, rank, 2, micro_batch_tokens=budget,
                                                             micro_batch_size=4, packed=packed)
            for micro in micro_batches:
                seen += micro.pairs
                ids = micro.layout.targets.tolist()
                lengths = micro.layout.scored_lengths
                assert len(lengths) == max(2 * len(micro.pairs), 1)
                # sequence 2i is pair i's chosen, 2i + 1 its rejected (their scored tokens in that order)
                cursor = 0
                for index, pair in enumerate(micro.pairs):
                    for side, item in enumerate((pairs[pair].chosen, pairs[pair].rejected)):
                        start = next(i for i, m in enumerate(item.mask) if m and i)
                        assert ids[cursor:cursor + lengths[2 * index + side]] == item.ids[start:]
                        cursor += lengths[2 * index + side]
            assert figures["pad_tokens"] == 0 or not packed
        assert sorted(seen) == list(range(24))


def test_the_demo_prefers_each_items_own_number():
    pairs = demo_pairs(50, seed=0)
    for pair in pairs:
        item = pair.prompt[0]["content"].split()[2]
        right, wrong = pair.chosen[0]["content"].split(), pair.rejected[0]["content"].split()
        assert right[1] == wrong[1] == item and right[0] != wrong[0]
    by_item = {}
    for pair in pairs:
        by_item.setdefault(pair.prompt[0]["content"].split()[2], set()).add(pair.chosen[0]["content"])
    assert all(len(answers) == 1 for answers in by_item.values())
    answers = {pair.chosen[0]["content"].split()[0] for pair in pairs}  # a rejected number is no item's answer
    assert not any(pair.rejected[0]["content"].split()[0] in answers for pair in pairs)
    assert json.dumps(demo_pairs(5, seed=0)[0].__dict__) == json.dumps(pairs[0].__dict__)
