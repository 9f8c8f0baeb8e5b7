"""engine/packing/layout.py and probe.py, with engine/rl/logprobs.py on them: packed and padded micro-batches
give each sequence's log-probs (and gradients) as the sequence alone does; an attention that mixes packed sequences is
caught by the probe."""

import pytest
import torch

from engine.packing import SequenceBatch, build_layout, probe_packed_input, register_packed_sdpa
from engine.rl.logprobs import response_log_probs, sequence_log_probs
from engine.tiny_model import tiny_qwen2

VOCAB = 96
PROMPTS, RESPONSES = (3, 5, 1, 4), (4, 1, 7, 3)


def _batch():
    g = torch.Generator().manual_seed(0)
    return SequenceBatch.from_parts([torch.randint(0, VOCAB, (n,), generator=g) for n in PROMPTS],
                                    [torch.randint(0, VOCAB, (n,), generator=g) for n in RESPONSES])


def _model(**config):
    return tiny_qwen2(seed=0, vocab_size=VOCAB, hidden_size=32, layers=2, **config).eval()


def _alone(model, batch, i):
    """Log-probs of sequence ``i``'s response, run on its own: the plain formula."""
    start, end = int(batch.starts[i]), int(batch.lengths[i])
    ids = batch.tokens[i, :end]
    logits = model(input_ids=ids[None]).logits[0, start - 1:end - 1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[start:end, None])[:, 0]


def test_packed_layout_is_one_row_with_restarting_positions_and_no_padding():
    batch = _batch()
    packed = build_layout(batch, [2, 0], packed=True)
    lengths = [PROMPTS[2] + RESPONSES[2], PROMPTS[0] + RESPONSES[0]]
    assert set(packed.inputs) == {"input_ids", "position_ids"}  # no attention mask
    assert packed.inputs["input_ids"].shape == (1, sum(lengths)) and packed.pad_tokens == 0
    assert packed.inputs["position_ids"][0].tolist() == list(range(lengths[0])) + list(range(lengths[1]))
    # Each response token is predicted by the position before it: 7 of sequence 2 (prompt of 1), then 4.
    assert packed.logits_to_keep.tolist() == list(range(0, 7)) + [lengths[0] + p for p in range(2, 6)]
    assert torch.equal(packed.targets, torch.cat([batch.tokens[2, 1:8], batch.tokens[0, 3:7]]))
    assert packed.scored_mask.tolist() == [[1] * 7, [1] * 4 + [0] * 3]
    padded = build_layout(batch, [2, 0], packed=False)
    assert padded.inputs["input_ids"].shape == (2, 8) and padded.pad_tokens == 1
    assert padded.inputs["attention_mask"].tolist() == [[1] * 8, [1] * 7 + [0]]
    filler = build_layout(batch, [], packed=True)
    assert filler.filler and filler.pad_tokens == 2 and filler.scored_mask.tolist() == [[0]]


@pytest.mark.parametrize("attention", ["packed_sdpa", "sdpa", "eager"])
def test_packed_and_padded_log_probs_and_gradients_equal_each_sequence_alone(attention):
    register_packed_sdpa()
    torch.manual_seed(0)
    model, batch = _model(attn_implementation=attention), _batch()
    weights = torch.randn(4, max(RESPONSES))
    want = [_alone(model, batch, i) for i in range(4)]
    (sum((w[:len(x)] * x).sum() for w, x in zip(weights, want, strict=True))).backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    for packed in (True, False):
        model.zero_grad()
        micro = build_layout(batch, [0, 1, 2, 3], packed=packed)
        got, entropy = sequence_log_probs(model, micro, 1.0, with_entropy=True)
        assert got.shape == entropy.shape == (4, max(RESPONSES))
        for i, expected in enumerate(want):
            assert torch.allclose(got[i, :RESPONSES[i]], expected, atol=1e-5), (packed, i)
            assert (got[i, RESPONSES[i]:] == 0).all()
        (weights * got * micro.scored_mask).sum().backward()
        for a, b in zip(model.parameters(), want_grads, strict=True):
            assert torch.allclose(a.grad, b, atol=1e-5, rtol=1e-4), packed


def test_models_without_a_plain_output_layer_and_the_left_padded_api_agree():
    batch = _batch()
    with torch.no_grad():
        model = _model()
        fused = sequence_log_probs(model, build_layout(batch, [0, 1, 2, 3], packed=True), 0.7)
        model.config.logit_scale = 1.0  # not a plain linear head as far as logprobs.py knows: full logits path
        unfused = sequence_log_probs(model, build_layout(batch, [0, 1, 2, 3], packed=True), 0.7)
        del model.config.logit_scale
        assert torch.allclose(fused, unfused, atol=1e-5)
        # The left-padded rollout layout: sequence 0 alone, prompt left-padded by one.
        ids = torch.cat([torch.zeros(1, dtype=torch.long), batch.tokens[0, :7]])[None]
        mask = torch.tensor([[0] + [1] * 7])
        old_api = response_log_probs(model, ids, mask, prompt_length=4, temperature=0.7)
        assert torch.allclose(old_api[0], fused[0, :4], atol=1e-5)


def test_the_probe_passes_sdpa_and_eager_and_catches_an_attention_that_ignores_the_packing():
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def whole_row_causal(module, query, key, value, attention_mask, **kwargs):
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)

    AttentionInterface.register("test_whole_row_causal", whole_row_causal)
    for attention in (register_packed_sdpa(), "sdpa", "eager"):
        result = probe_packed_input(_model(attn_implementation=attention), torch.device("cpu"), VOCAB)
        assert result.works and result.packed_error < 1e-5 < result.leak_error, (attention, result)
    broken = probe_packed_input(_model(attn_implementation="test_whole_row_causal"), torch.device("cpu"), VOCAB)
    assert not broken.works and broken.leak_error < 1e-5 < broken.packed_error, broken
    assert "differ from padded ones" in broken.describe()


def test_packed_sdpa_is_sdpa_except_on_packed_rows():
    """Generation (left padding, a cache) and padded rows go to transformers' sdpa unchanged; a packed row's
    sequences are attended one by one, without the row-sized mask (none is built: the mask function's marker)."""
    from transformers.masking_utils import create_causal_mask

    plain, packed = _model(attn_implementation="sdpa"), _model(attn_implementation=register_packed_sdpa())
    prompts = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        options = {"max_new_tokens": 6, "do_sample": False}
        assert torch.equal(plain.generate(input_ids=prompts, attention_mask=attention_mask, **options),
                           packed.generate(input_ids=prompts, attention_mask=attention_mask, **options))
        padded = build_layout(_batch(), [0, 1, 2, 3], packed=False)
        assert torch.equal(plain(**padded.inputs).logits, packed(**padded.inputs).logits)
    row = build_layout(_batch(), [0, 1, 2, 3], packed=True).inputs
    embeddings = torch.zeros(1, row["input_ids"].size(1), 32)
    marker = create_causal_mask(config=packed.config, inputs_embeds=embeddings, attention_mask=None, cache=None,
                                position_ids=row["position_ids"])
    assert marker.numel() == 0  # sdpa would build a [1, 1, 29, 29] block-diagonal mask here


def test_packed_sdpa_groups_sequences_of_similar_length_and_keeps_gradients_exact():
    from engine.packing.attention import length_groups

    assert length_groups([9, 8, 9, 7]) == [[0, 2, 1, 3]]  # similar lengths: one kernel call
    assert length_groups([5, 130, 5, 5, 5]) == [[1, 0], [2, 3, 4]]  # at most 2x the work: not one group
    g = torch.Generator().manual_seed(1)
    sizes = [(30, 12), (2, 1), (3, 2), (1, 40)]  # (prompt, response): three groups of very different lengths
    batch = SequenceBatch.from_parts([torch.randint(0, VOCAB, (p,), generator=g) for p, _ in sizes],
                                     [torch.randint(0, VOCAB, (r,), generator=g) for _, r in sizes])
    packed_model, plain = _model(attn_implementation=register_packed_sdpa()), _model(attn_implementation="eager")
    grads = []
    for model, packed in ((packed_model, True), (plain, False)):
        micro = build_layout(batch, [0, 1, 2, 3], packed=packed)
        (sequence_log_probs(model, micro, 1.0) * micro.scored_mask).sum().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
