"""``algorithm.loss_type``: each name is a recipe of the building blocks in ``formulas.py`` (how the per-token
loss is formed, how it is aggregated, the clip range and how advantages are scaled), as verl and TRL name them.

A recipe only fills what the user left unset: ``algorithm.loss_agg``, ``clip_low``, ``clip_high`` and
``scale_rewards`` given explicitly win over the recipe's values. ``resolve`` turns an ``AlgorithmConfig`` into
the concrete settings the algorithm uses, once, when it is built (``GRPOAlgorithm.settings``).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Recipe:
    loss_mode: str  # algorithms.policy_loss's loss_mode: vanilla, gspo or cispo
    agg: str  # algorithms.aggregate_loss's mode
    clip_low: float
    clip_high: float
    scale_rewards: str  # algorithms.grpo_advantages's scale: group, batch or none
    verl: str  # the same settings in verl
    trl: str  # the same settings in TRL's GRPOConfig


LOSS_TYPES: dict[str, Recipe] = {
    # The GRPO paper: each sequence's token mean, then the mean over sequences.
    "grpo": Recipe("vanilla", "seq-mean-token-mean", 0.2, 0.2, "group",
                   verl="actor.loss_agg_mode=seq-mean-token-mean", trl='loss_type="grpo"'),
    # DAPO: every token of the mini-batch weighs the same; clip-higher.
    "dapo": Recipe("vanilla", "token-mean", 0.2, 0.28, "group",
                   verl="actor.loss_agg_mode=token-mean, actor.clip_ratio_high=0.28",
                   trl='loss_type="dapo", epsilon_high=0.28'),
    # Dr. GRPO: no std scaling, token sums divided by a constant (the longest response allowed).
    "dr_grpo": Recipe("vanilla", "seq-mean-token-sum-norm", 0.2, 0.2, "none",
                      verl="actor.loss_agg_mode=seq-mean-token-sum-norm, algorithm.norm_adv_by_std_in_grpo=false",
                      trl='loss_type="dr_grpo", scale_rewards="none"'),
    # TRL's bnpo: the token mean of each micro-batch, every micro-batch weighing the same.
    "bnpo": Recipe("vanilla", "micro-batch-token-mean", 0.2, 0.2, "group",
                   verl="(none)", trl='loss_type="bnpo"'),
    # GSPO: one importance ratio per sequence, clipped as a whole (the paper's clip range).
    "gspo": Recipe("gspo", "seq-mean-token-mean", 3e-4, 4e-4, "group",
                   verl="actor.policy_loss.loss_mode=gspo, actor.loss_agg_mode=seq-mean-token-mean, "
                        "actor.clip_ratio_low=3e-4, actor.clip_ratio_high=4e-4",
                   trl='importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4'),
    # CISPO (MiniMax-M1): the importance weight clipped and detached; no lower bound, weights capped at 5.
    "cispo": Recipe("cispo", "token-mean", 1.0, 4.0, "group",
                    verl="actor.policy_loss.loss_mode=cispo, actor.clip_ratio_low=1.0, actor.clip_ratio_high=4.0",
                    trl='loss_type="cispo", epsilon_high=5.0'),
}
DEFAULT_LOSS_TYPE = "dapo"


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """Everything ``_step_fn`` and ``collect`` need to form the loss, concrete (no recipe left to apply)."""

    loss_type: str
    loss_mode: str
    agg: str
    clip_low: float
    clip_high: float
    clip_c: float | None
    scale_rewards: str
    norm_length: int | None  # for seq-mean-token-sum-norm
    kl_loss_coef: float
    kl_kind: str
    entropy_coeff: float


def kl_loss_coef(algorithm) -> float:
    """``algorithm.kl_loss_coef``, or the older ``algorithm.kl_coef`` when that is set."""
    return algorithm.kl_coef if algorithm.kl_coef is not None else algorithm.kl_loss_coef


def scale_rewards(algorithm) -> str:
    """``algorithm.scale_rewards``; else the older ``norm_by_std`` (true: group, false: none); else the recipe's."""
    if algorithm.scale_rewards is not None:
        return algorithm.scale_rewards
    if algorithm.norm_by_std is not None:
        return "group" if algorithm.norm_by_std else "none"
    return LOSS_TYPES[algorithm.loss_type].scale_rewards


def resolve(algorithm, max_new_tokens: int) -> LossSettings:
    """The concrete settings of an ``AlgorithmConfig`` (its ``loss_type`` must be known: ``config.check`` says)."""
    recipe = LOSS_TYPES[algorithm.loss_type]

    def pick(value, default):
        return default if value is None else value

    agg = pick(algorithm.loss_agg, recipe.agg)
    return LossSettings(
        loss_type=algorithm.loss_type,
        loss_mode=recipe.loss_mode,
        agg=agg,
        clip_low=pick(algorithm.clip_low, recipe.clip_low),
        clip_high=pick(algorithm.clip_high, recipe.clip_high),
        clip_c=algorithm.clip_c,
        scale_rewards=scale_rewards(algorithm),
        norm_length=pick(algorithm.loss_norm_length, max_new_tokens) if agg == "seq-mean-token-sum-norm" else None,
        kl_loss_coef=kl_loss_coef(algorithm),
        kl_kind=algorithm.kl_kind,
        entropy_coeff=algorithm.entropy_coeff,
    )
