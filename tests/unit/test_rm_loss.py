"""accel-rm's scores and loss on a real tiny reward model, in process: each sequence's reward, packed or padded,
is what ``AutoModelForSequenceClassification`` gives that sequence alone (the score an export serves); the
Bradley-Terry loss with margins and the centring term, its metrics and its gradients equal formulas computed
independently here, packed as padded."""

import pytest
import torch
import torch.nn.functional as F
from sft_reference import relative_error

from engine.demo_model import build_tokenizer
from engine.offline.objectives.rm.config import RewardSettings
from engine.offline.objectives.rm.loss import pair_losses
from engine.offline.objectives.rm.model import scoring_pair
from engine.offline.objectives.rm.trainer import reward_loss, sequence_rewards
from engine.offline.pair_batches import chosen_and_rejected, rank_pair_micro_batches
from engine.offline.pair_data import demo_pairs
from engine.offline.pairs import tokenize_pair
from engine.sequence_parallel import SequenceParallel
from engine.tiny_model import tiny_qwen2_config

CPU, ONE = torch.device("cpu"), SequenceParallel.single(0, 1)
MARGINS = [0.5, -0.25, 0.0, 1.0, 0.1]


@pytest.fixture(scope="module")
def setup():
    from transformers import Qwen2ForSequenceClassification

    tokenizer = build_tokenizer(512)
    pairs = [tokenize_pair(p, tokenizer) for p in demo_pairs(5, seed=4)]
    for pair, margin in zip(pairs, MARGINS, strict=True):
        pair.margin = margin
    torch.manual_seed(0)
    config = tiny_qwen2_config(vocab_size=len(tokenizer), hidden_size=32, layers=2, num_labels=1,
                               pad_token_id=tokenizer.pad_token_id)
    model = Qwen2ForSequenceClassification(config).float()
    torch.nn.init.normal_(model.score.weight, std=0.5)  # rewards far enough apart to tell pairs apart
    return pairs, model


def _micro_batch(pairs, packed):
    micro, _ = rank_pair_micro_batches([scoring_pair(p) for p in pairs], 0, 1, micro_batch_tokens=None,
                                       micro_batch_size=len(pairs), packed=packed)
    return micro[0]


def _alone(model, item) -> torch.Tensor:
    return model(input_ids=torch.tensor([item.ids])).logits[0, 0]


def test_each_reward_is_the_classifiers_score_of_the_sequence_alone(setup):
    pairs, model = setup
    with torch.no_grad():
        want = torch.stack([_alone(model, side) for pair in pairs for side in (pair.chosen, pair.rejected)])
        for packed in (True, False):
            got = sequence_rewards(model, _micro_batch(pairs, packed), CPU, ONE)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("settings", [RewardSettings(), RewardSettings(margin_key="m", center_rewards_coef=0.3)],
                         ids=["plain", "margins, centred"])
def test_loss_metrics_and_gradients_match_an_independent_computation(setup, settings):
    pairs, model = setup
    chosen = torch.stack([_alone(model, p.chosen) for p in pairs]).double()  # scores with gradients
    rejected = torch.stack([_alone(model, p.rejected) for p in pairs]).double()
    margins = torch.tensor(MARGINS, dtype=torch.float64) if settings.margin_key else torch.zeros(len(pairs))
    difference = chosen - rejected - margins
    want = (torch.log1p(torch.exp(-difference)) + settings.center_rewards_coef * (chosen + rejected) ** 2).mean()
    want.backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for packed in (True, False):
        loss, weight, metrics = reward_loss(model, _micro_batch(pairs, packed), CPU, ONE, settings)
        loss.backward()
        assert weight == len(pairs)
        assert loss.item() == pytest.approx(want.item(), rel=1e-5)
        assert 0 < metrics["accuracy"].item() < 1
        assert metrics["accuracy"].item() == pytest.approx(float((chosen > rejected).double().mean()))
        # A mean of differences of nearby float32 scores: its relative error grows with the cancellation (2e-7
        # absolute, 1.2e-5 relative on this machine's Xeon), so it gets an absolute floor too.
        assert metrics["rewards/margins"].item() == pytest.approx(float((chosen - rejected).detach().mean()),
                                                                  rel=1e-5, abs=1e-6)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        assert relative_error(grads, want_grads) < 1e-5, packed


def test_the_formula_on_known_values():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    assert pair_losses(chosen, rejected).tolist() == pytest.approx([-F.logsigmoid(torch.tensor(1.0)).item(),
                                                                     -F.logsigmoid(torch.tensor(-1.0)).item()])
    margined = pair_losses(chosen, rejected, torch.tensor([1.0, -1.0]), center_coef=0.5)
    assert margined.tolist() == pytest.approx([0.693147 + 0.5 * 9, 0.693147 + 0.5 * 1], rel=1e-5)
    c, r = chosen_and_rejected(torch.arange(6.0))
    assert c.tolist() == [0, 2, 4] and r.tolist() == [1, 3, 5]
