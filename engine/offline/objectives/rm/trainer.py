"""The reward model's parts and step, run by every rank inside the frame's loop: for each global batch of pairs,
this rank's micro-batches (a pair's chosen and rejected together, packed in one row where the model keeps packed
sequences apart) -> forward/backward with the Bradley-Terry loss (``loss.py``) -> optimizer step; validation over
the held-out pairs. The step's loss is the mean over the global batch's pairs, exact whatever the split."""

from __future__ import annotations

import functools

import torch

from .... import FSDPEngine
from ....packing import SequenceBatch, build_layout
from ....runtime import on_every_rank
from ....train.recipe import Evaluation, Plan
from ...pair_batches import PairMicroBatch, PairObjective, chosen_and_rejected, group_total, rank_share, sequence_sums
from ...run_config import engine_config
from ...step import Parts, score
from .config import RewardSettings
from .loss import METRICS, pair_losses, pair_metrics
from .model import factory, token_rewards

CURVES = (("loss", "loss"), ("val/loss", "validation loss"), ("accuracy", "accuracy"),
          ("val/accuracy", "validation accuracy"), ("rewards/margins", "reward margin"),
          ("val/rewards/margins", "validation reward margin"), ("grad_norm", "grad norm"),
          ("step_time_s", "step time (s)"))


def sequence_rewards(module, micro: PairMicroBatch, device, sp) -> torch.Tensor:
    """Each sequence's reward ``[n]`` (with sequence parallelism: the group's, summed from each rank's own)."""
    layout, mask = rank_share(micro, sp, device)
    return group_total(sequence_sums(token_rewards(module, layout) * mask, layout, layout.sequences), sp)


def reward_loss(module, micro: PairMicroBatch, device, sp, settings: RewardSettings):
    """One micro-batch's mean pair loss (this rank's share of it with a sequence-parallel group ``sp``), weighted by
    its pairs, and its metrics."""
    rewards = sequence_rewards(module, micro, device, sp)
    pairs = len(micro.pairs)
    if not pairs:  # a filler: it joins the collectives and weighs nothing
        return rewards.sum() * 0.0, 0.0, {name: 0.0 for name in METRICS}
    chosen, rejected = chosen_and_rejected(rewards)
    margins = micro.margins.to(device) if settings.margin_key else None
    loss = pair_losses(chosen, rejected, margins, settings.center_rewards_coef).mean()
    metrics = pair_metrics(chosen, rejected)
    return loss / sp.size, float(pairs), {name: value / sp.size for name, value in metrics.items()}


def packed_rewards_supported(engine: FSDPEngine, device) -> bool:
    """Whether packed rows score each sequence as padded rows do (an attention that leaks across packed sequences
    gives other scores); every rank runs the same forwards and they agree on the verdict."""
    ids = [torch.arange(3, 9), torch.arange(11, 21)]
    batch = SequenceBatch.from_parts(ids, [torch.zeros(1, dtype=torch.long)] * 2)
    with engine.eval_mode(), torch.no_grad():
        padded = token_rewards(engine.module, build_layout(batch, [0, 1], packed=False).to(device))
        try:
            packed = token_rewards(engine.module, build_layout(batch, [0, 1], packed=True).to(device))
        except Exception:  # noqa: BLE001 - an attention that refuses packed input is a "no", not a crash
            packed = None
    works = packed is not None and float((packed - padded).abs().max()) <= 1e-4 * (1 + float(padded.abs().max()))
    return on_every_rank(works, engine.backend.metrics_device())


class RewardObjective(PairObjective):
    """The Bradley-Terry loss on the rewards the head reads at each sequence's last token."""

    metrics, lm_head = METRICS, False

    def loss(self, parts, items):
        return functools.partial(reward_loss, device=parts.backend.device(), sp=parts.engine.sequence_parallel,
                                 settings=parts.plan.config.rm)


def build_engine(config, total_steps: int, backend, pad_token_id: int | None, model_dir: str | None = None):
    """The reward model's engine: a new head on ``model.path`` (or ``model_dir``: a reward model's own directory
    keeps its head)."""
    source = factory(model_dir or config.model.path, config.train.seed, pad_token_id)
    return FSDPEngine(source, engine_config(config, total_steps), backend)


def build(plan: Plan, backend) -> Parts:
    config = plan.config
    engine = build_engine(config, plan.total_steps, backend, plan.derived["pad_token_id"])
    packed = config.train.padding_free and packed_rewards_supported(engine, backend.device())
    return Parts(plan, engine, backend, packed, RewardObjective())


def evaluate(config, model_dir: str | None, backend) -> Evaluation:
    """The eval command's figures on this rank: the validation figures of ``model_dir`` (a reward model directory)
    or of ``model.path``."""
    from ...model_files import load_tokenizer
    from ...pair_eval import evaluation_set
    from .model import scoring_pair

    tokenizer = load_tokenizer(config.model.path)
    pairs = evaluation_set(config, config.rm.margin_key)
    engine = build_engine(config, 1, backend, tokenizer.pad_token_id, model_dir)
    parts = Parts(Plan(config, engine.world_size, 1, {}), engine, backend,
                  config.train.padding_free and packed_rewards_supported(engine, backend.device()), RewardObjective())
    return Evaluation(score(parts, [scoring_pair(p) for p in pairs]))
