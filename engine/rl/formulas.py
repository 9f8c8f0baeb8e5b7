"""The RL layer's formulas under one name, public as ``engine.grpo.algorithms`` (until issue 47 this module was
``engine/rl/algorithms.py``, now the algorithms' packages): the advantage estimators and reward combinations
(``advantages.py``) and the per-token losses with their aggregations (``losses.py``). The step's loss is a weighted
sum of terms made of these (``terms.py``); ``docs/algorithms.md`` gives every formula and key.
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    MULTI_REWARD_MODES,
    SCALE_MODES,
    SEQUENCE_ESTIMATORS,
    TOKEN_ESTIMATORS,
    combine_rewards,
    grpo_advantages,
    normalize_in_groups,
    outcome_token_rewards,
    overlong_penalty,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    returns_to_go,
    rloo_advantages,
    whiten,
)
from .gae import gae_advantages
from .losses import (
    AGGREGATION_MODES,
    KL_KINDS,
    LOSS_MODES,
    aggregate_loss,
    clipped_policy_gradient,
    kl_penalty,
    masked_mean,
    micro_batch_scale,
    policy_loss,
)

__all__ = ["gae_advantages",
           "ADVANTAGE_ESTIMATORS", "AGGREGATION_MODES", "KL_KINDS", "LOSS_MODES", "MULTI_REWARD_MODES", "SCALE_MODES",
           "SEQUENCE_ESTIMATORS", "TOKEN_ESTIMATORS", "aggregate_loss",
           "clipped_policy_gradient", "combine_rewards", "grpo_advantages", "kl_penalty", "masked_mean",
           "micro_batch_scale", "normalize_in_groups", "outcome_token_rewards", "overlong_penalty", "policy_loss",
           "reinforce_pp_advantages", "reinforce_pp_baseline_advantages", "returns_to_go", "rloo_advantages",
           "whiten"]
