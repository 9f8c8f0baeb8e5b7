"""Loss masks of accel-sft on a Qwen2.5-style chat template, with and without generation markers: the same mask
either way; each assistant turn's content and <|im_end|> trained, the header and the newline after it never;
and every bad input fails with the row named."""

import json

import pytest

from engine.demo_model import CHAT_TEMPLATE, build_tokenizer
from engine.offline.epochs import schedule
from engine.offline.masks import (
    conversation_mask_by_turns,
    fit_length,
    has_generation_markers,
    tokenize_example,
)
from engine.offline.objectives.sft.data import Columns, DataError, Example, load_examples

# Qwen2.5's template with {% generation %} around what the assistant writes (content and end of turn).
MARKED_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "{% if message['role'] == 'assistant' %}<|im_start|>assistant\n{% generation %}{{ message['content'] }}"
    "<|im_end|>{% endgeneration %}{{ '\\n' }}"  # a newline right after a block tag would be trimmed
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "how many apples"},
                {"role": "assistant", "content": "the answer is 12"},
                {"role": "user", "content": "and books"},
                {"role": "assistant", "content": "3 books"}]


@pytest.fixture(scope="module")
def tokenizers():
    plain = build_tokenizer(512)
    marked = build_tokenizer(512)
    marked.chat_template = MARKED_TEMPLATE
    return plain, marked


def _trained_text(tokenizer, item) -> list[str]:
    """The trained spans, decoded one run of consecutive trained tokens at a time."""
    spans, current = [], []
    for token, trained in zip(item.ids, item.mask, strict=True):
        if trained:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    if current:
        spans.append(tokenizer.decode(current))
    return spans


def test_assistant_masks_with_and_without_markers_agree_and_train_the_end_of_turn(tokenizers):
    plain, marked = tokenizers
    assert not has_generation_markers(plain) and has_generation_markers(marked)
    example = Example("chat.jsonl:1", messages=CONVERSATION)
    by_turns = tokenize_example(example, plain, "assistant")
    by_markers = tokenize_example(example, marked, "assistant")
    assert by_turns.ids == by_markers.ids == list(plain.apply_chat_template(CONVERSATION, tokenize=True,
                                                                            return_dict=True)["input_ids"])
    assert by_turns.mask == by_markers.mask
    assert _trained_text(plain, by_turns) == ["the answer is 12<|im_end|>", "3 books<|im_end|>"]
    end, header = plain.convert_tokens_to_ids("<|im_end|>"), plain.convert_tokens_to_ids("<|im_start|>")
    assert sum(m for t, m in zip(by_turns.ids, by_turns.mask, strict=True) if t == end) == 2  # one per turn
    assert all(not m for t, m in zip(by_turns.ids, by_turns.mask, strict=True) if t == header)
    assert by_turns.supervised == sum(by_turns.mask)


def test_loss_on_all_and_prompt_completion(tokenizers):
    plain, _ = tokenizers
    everything = tokenize_example(Example("x:1", messages=CONVERSATION), plain, "all")
    assert all(everything.mask)
    text = tokenize_example(Example("x:2", prompt="how many apples", completion=" 12"), plain, "completion")
    assert _trained_text(plain, text) == [" 12<|im_end|>"]  # the completion and the EOS appended to it
    conversational = Example("x:3", prompt=CONVERSATION[:4], completion=CONVERSATION[4:])
    item = tokenize_example(conversational, plain, "completion")
    assert _trained_text(plain, item) == ["3 books<|im_end|>"]  # the prompt's assistant turn is context


def test_a_template_that_rewrites_earlier_turns_cannot_give_a_mask(tokenizers):
    plain, _ = tokenizers
    rewriting = build_tokenizer(512)
    # Like templates that drop earlier turns' reasoning: an assistant turn renders differently once it is not last.
    content = "{{ message['content'] or '' }}"  # the assistant branch of the fixture's template
    assert content in CHAT_TEMPLATE
    rewriting.chat_template = CHAT_TEMPLATE.replace(
        content, "{% if message['role'] == 'assistant' and not loop.last %}(earlier){% else %}" + content
        + "{% endif %}")
    with pytest.raises(DataError, match=r"^chat.jsonl:7: the chat template cannot produce an assistant mask"):
        conversation_mask_by_turns(rewriting, CONVERSATION, None, "chat.jsonl:7")


def test_markers_that_mark_nothing_and_missing_templates_are_errors(tokenizers):
    empty = build_tokenizer(512)
    empty.chat_template = MARKED_TEMPLATE.replace("{% generation %}{{ message['content'] }}<|im_end|>"
                                                  "{% endgeneration %}",
                                                  "{{ message['content'] }}<|im_end|>{% generation %}"
                                                  "{% endgeneration %}")
    with pytest.raises(DataError, match=r"^d.jsonl:4: the chat template's generation markers marked no"):
        tokenize_example(Example("d.jsonl:4", messages=CONVERSATION), empty, "assistant")
    bare = build_tokenizer(512)
    bare.chat_template = None
    with pytest.raises(DataError, match=r"^d.jsonl:5: conversational data needs a chat template"):
        tokenize_example(Example("d.jsonl:5", messages=CONVERSATION), bare, "assistant")


def test_truncation_modes(tokenizers):
    plain, _ = tokenizers
    item = tokenize_example(Example("t.jsonl:9", messages=CONVERSATION), plain, "assistant")
    cut = fit_length(item, 10, "keep_start")
    assert cut.ids == item.ids[:10] and cut.mask == item.mask[:10]
    assert fit_length(item, 10, "drop") is None
    assert fit_length(item, len(item.ids), "error") is item
    with pytest.raises(DataError, match=rf"^t.jsonl:9: {len(item.ids)} tokens, above data.max_length=10: raise"):
        fit_length(item, 10, "error")


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize("rows, message", [
    ([{"messages": CONVERSATION}, {"messages": [{"role": "user", "content": "hi"}]}],
     r"data.jsonl:2: the conversation has no assistant turn"),
    ([{"messages": CONVERSATION}, {"messages": [{"speaker": "user", "text": "hi"}]}],
     r"data.jsonl:2: message 0 of 'messages' is not a \{\"role\", \"content\"\} pair"),
    ([{"messages": CONVERSATION}, {"conversation": CONVERSATION}],
     r"data.jsonl:2: no column 'messages' \(columns: conversation\): set data.messages_key="),
    ([{"prompt": "a", "completion": ["x"]}], r"data.jsonl:1: prompt and completion must both be text or both"),
    ([{"question": "a"}], r"data.jsonl:1: cannot tell the data format from the columns \['question'\]"),
])
def test_bad_rows_name_the_file_and_row(tmp_path, rows, message):
    with pytest.raises(DataError, match=message.replace("data.jsonl", str(tmp_path / "data.jsonl"))):
        load_examples(_write(tmp_path / "data.jsonl", rows), "auto", Columns())


def test_auto_detects_each_format_and_custom_columns(tmp_path):
    cases = [({"text": "hello"}, "text"), ({"messages": CONVERSATION}, "messages"),
             ({"prompt": "a", "completion": "b"}, "prompt_completion")]
    for row, fmt in cases:
        assert load_examples(_write(tmp_path / "d.jsonl", [row]), "auto", Columns())[1] == fmt
    examples, fmt = load_examples(_write(tmp_path / "d.jsonl", [{"chat": CONVERSATION}]), "auto",
                                  Columns(messages="chat"))
    assert fmt == "messages" and examples[0].messages == CONVERSATION


def test_schedule_is_seeded_independent_of_ranks_and_counts_epochs():
    lengths = [5 + (i * 7) % 13 for i in range(50)]
    batches = schedule(lengths, batch_size=8, batch_tokens=None, epochs=2, steps=None, seed=3)
    assert len(batches) == 12  # 100 sequences, full batches of 8
    assert all(len(b.indices) == 8 for b in batches)
    first_epoch = [i for b in batches[:6] for i in b.indices] + list(batches[6].indices[:2])
    assert sorted(first_epoch) == list(range(50))  # each example once per epoch
    assert schedule(lengths, batch_size=8, batch_tokens=None, epochs=2, steps=None, seed=3) == batches
    assert schedule(lengths, batch_size=8, batch_tokens=None, epochs=2, steps=None, seed=4) != batches
    steps = schedule(lengths, batch_size=8, batch_tokens=None, epochs=1, steps=20, seed=3)
    assert steps[:12] == batches and len(steps) == 20  # steps go on through further epochs, same order
    by_tokens = schedule(lengths, batch_size=8, batch_tokens=60, epochs=1, steps=None, seed=3)
    assert all(sum(lengths[i] for i in b.indices) <= 60 for b in by_tokens)
    assert sum(len(b.indices) for b in by_tokens) <= 50 and by_tokens[-1].epoch <= 1.0
