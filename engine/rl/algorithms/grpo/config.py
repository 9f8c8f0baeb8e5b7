"""``GRPOConfig``: presets, a YAML file and ``key=value`` overrides, checked before any worker starts."""

from __future__ import annotations

from accel_backends.names import not_one_of

from ....config import EngineConfig
from ....train import config as train_config
from ....train.config import apply, coerce, parse_override  # noqa: F401  (GRPO's names for them)
from ... import checks as rl_checks
from ...checks import engine_facts, vllm_check  # noqa: F401  (GRPO's names for them)
from ...engine_settings import engine_config as rl_engine_config
from ...engine_settings import resolved  # noqa: F401  (GRPO's name for it)
from ...formulas import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    KL_KINDS,
    MULTI_REWARD_MODES,
    SCALE_MODES,
    TOKEN_ESTIMATORS,
)
from ...sizes import (  # noqa: F401  (GRPO's names for them)
    data_parallel_groups,
    derived,
    max_sequence_tokens,
    mini_batch_sequences,
    prompt_token_limit,
    prompts_per_rank,
    sequences_per_rank,
    updates_per_step,
)
from .loss_types import LOSS_TYPES
from .schema import (  # noqa: F401  (the config's sections, by their usual names)
    PRESETS,
    AlgorithmConfig,
    DataConfig,
    GRPOConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)


def build_config(preset: str | None, config_file: str | None, overrides: list[str]) -> GRPOConfig:
    """Preset, then the YAML file, then the overrides, in that order (``engine.train.config``)."""
    return train_config.build_config(GRPOConfig, PRESETS, preset, config_file, overrides)


def require_valid(config: GRPOConfig, world_size: int) -> None:
    """``check``'s problems as one ValueError: one line for one problem, a list for several."""
    train_config.require_valid(check(config, world_size))


def apply_loss_type(config: GRPOConfig) -> list[str]:
    """Fill the keys ``algorithm.loss_type`` decides that were left null, and move deprecated keys to their new
    names. Returns notices for the user (one sentence each). An unknown loss type is left for ``check``."""
    a, notices = config.algorithm, []
    if a.kl_coef is not None:
        notices.append(f"algorithm.kl_coef is deprecated: it is algorithm.kl_loss_coef (the KL term in the loss: "
                       f"verl's actor.kl_loss_coef, TRL's beta); using kl_loss_coef={a.kl_coef}")
        a.kl_loss_coef, a.kl_coef = a.kl_coef, None
    if a.norm_by_std is not None:
        implied = "group" if a.norm_by_std else "none"
        if a.scale_rewards is None or a.scale_rewards == implied:
            notices.append(f"algorithm.norm_by_std is deprecated: using algorithm.scale_rewards={implied}")
            a.scale_rewards = implied
        else:
            notices.append(f"algorithm.norm_by_std is deprecated and ignored: algorithm.scale_rewards="
                           f"{a.scale_rewards} is set")
        a.norm_by_std = None
    recipe = LOSS_TYPES.get(a.loss_type)
    if recipe is not None:
        for key in ("loss_agg", "clip_low", "clip_high", "scale_rewards"):
            if getattr(a, key) is None:
                setattr(a, key, getattr(recipe, "agg" if key == "loss_agg" else key))
    return notices


def _estimator_problems(a) -> list[str]:
    """``algorithm.advantage``, ``multi_reward``, ``gamma`` and ``kl_reward_coef``."""
    problems = []
    if a.advantage not in ADVANTAGE_ESTIMATORS:
        problems.append(not_one_of("algorithm.advantage", a.advantage, ADVANTAGE_ESTIMATORS))
    if a.multi_reward not in MULTI_REWARD_MODES:
        problems.append(f"algorithm.multi_reward must be one of {', '.join(MULTI_REWARD_MODES)}, got "
                        f"{a.multi_reward!r}")
    if not isinstance(a.gamma, (int, float)) or isinstance(a.gamma, bool) or not 0 <= a.gamma <= 1:
        problems.append(f"algorithm.gamma must be in [0, 1], got {a.gamma!r}")
    elif a.gamma != 1 and a.advantage != "reinforce_pp":
        problems.append(f"algorithm.gamma discounts reinforce_pp's per-token returns; with algorithm.advantage="
                        f"{a.advantage} set it to 1.0, or use algorithm.advantage=reinforce_pp")
    if not isinstance(a.kl_reward_coef, (int, float)) or isinstance(a.kl_reward_coef, bool) or a.kl_reward_coef < 0:
        problems.append(f"algorithm.kl_reward_coef must be >= 0, got {a.kl_reward_coef!r}")
    elif a.kl_reward_coef > 0 and a.advantage not in TOKEN_ESTIMATORS:
        problems.append(f"algorithm.kl_reward_coef folds a per-token KL penalty into the rewards of "
                        f"{' and '.join(TOKEN_ESTIMATORS)}; with algorithm.advantage={a.advantage} use "
                        "algorithm.kl_loss_coef (the KL term of the loss) instead")
    return problems


def _check_algorithm(config: GRPOConfig) -> list[str]:
    """GRPO's algorithm.* keys (the rollout-correction keys are the RL layer's); safe on values of any type."""
    a, r, problems = config.algorithm, config.rollout, []
    if a.loss_type not in LOSS_TYPES:
        problems.append(not_one_of("algorithm.loss_type", a.loss_type, LOSS_TYPES))
    if a.scale_rewards is not None and a.scale_rewards not in SCALE_MODES:
        problems.append(f"algorithm.scale_rewards must be one of {', '.join(SCALE_MODES)}, got {a.scale_rewards!r}")
    if a.loss_agg is not None and a.loss_agg not in AGGREGATION_MODES:
        problems.append(f"algorithm.loss_agg must be one of {', '.join(AGGREGATION_MODES)}, got {a.loss_agg!r}")
    recipe = LOSS_TYPES.get(a.loss_type)
    agg = a.loss_agg if a.loss_agg is not None else (recipe.agg if recipe else None)
    if agg == "seq-mean-token-sum-norm":
        length = a.loss_norm_length if a.loss_norm_length is not None else r.max_new_tokens
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            problems.append(f"algorithm.loss_type={a.loss_type} (loss_agg seq-mean-token-sum-norm) divides by a length "
                            f"constant: set rollout.max_new_tokens or algorithm.loss_norm_length to a positive integer "
                            f"(got {length!r})")
    if recipe is not None:
        low = a.clip_low if a.clip_low is not None else recipe.clip_low
        high = a.clip_high if a.clip_high is not None else recipe.clip_high
        low_ok = 0 <= low <= 1 if recipe.loss_mode == "cispo" else 0 <= low < 1
        if not low_ok or high <= 0:
            problems.append(f"algorithm.clip_low must be in [0, 1) ([0, 1] for cispo) and algorithm.clip_high > 0, "
                            f"got {low} and {high}")
        if a.clip_c is not None and recipe.loss_mode != "vanilla":
            problems.append(f"algorithm.clip_c (dual clipping) does not apply to loss_type {a.loss_type}: set it to "
                            "null")
    if a.clip_c is not None and a.clip_c <= 1:
        problems.append("algorithm.clip_c must be > 1 (or null)")
    problems += _estimator_problems(a)
    if a.kl_kind not in KL_KINDS:
        problems.append(f"algorithm.kl_kind must be one of {', '.join(KL_KINDS)}")
    for name in ("entropy_coeff", "kl_loss_coef", "kl_coef", "overlong_penalty_factor"):
        value = getattr(a, name)
        if value is not None and value < 0:
            problems.append(f"algorithm.{name} must be >= 0, got {value}")
    if a.filter_groups and (not isinstance(r.n, int) or r.n < 2):
        problems.append(f"algorithm.filter_groups needs rollout.n >= 2 (the rewards of a group of one are always "
                        f"all equal), got rollout.n={r.n!r}")
    if a.max_gen_batches < 1:
        problems.append(f"algorithm.max_gen_batches must be a positive integer, got {a.max_gen_batches}")
    if a.overlong_buffer_len < 0:
        problems.append(f"algorithm.overlong_buffer_len must be >= 0 (0: off), got {a.overlong_buffer_len}")
    elif a.overlong_buffer_len and isinstance(r.max_new_tokens, int) and a.overlong_buffer_len >= r.max_new_tokens:
        problems.append(f"algorithm.overlong_buffer_len={a.overlong_buffer_len} must be smaller than "
                        f"rollout.max_new_tokens={r.max_new_tokens} (the penalty starts that many tokens before the "
                        "limit)")
    if isinstance(r.n, int) and r.n == 1:
        problems.append("rollout.n must be at least 2: GRPO compares samples within a group")
    return problems


def deprecation_notices(config: GRPOConfig, world_size: int) -> list[str]:
    """Settings that still work this release but will not in the next, each with its replacement."""
    notices = []
    t = config.train
    if t.mini_batch_size is not None:
        prompts = mini_batch_sequences(config, world_size) / config.rollout.n
        equivalent = f"{prompts:g}" if prompts == int(prompts) else f"about {prompts:.1f}"
        notices.append(f"train.mini_batch_size counts sequences per rank and is deprecated (removed in the next "
                       f"release): set train.prompts_per_update, prompts per optimizer update over all ranks "
                       f"({equivalent} here on {world_size} rank(s)), which makes the same updates on any number of "
                       "ranks")
    return notices


def engine_config(config: GRPOConfig, world_size: int, frozen: bool = False) -> EngineConfig:
    """The policy's ``EngineConfig``, or with ``frozen`` the reference model's (``algorithm.ref_param_offload``)."""
    return rl_engine_config(config, world_size, config.algorithm.ref_param_offload if frozen else None)


def check(config: GRPOConfig, world_size: int) -> list[str]:
    """Every problem that can be found before a worker starts (paths, sizes, names), as sentences: the RL layer's
    shared sections (``engine/rl/checks.py``) and GRPO's ``algorithm.*``."""
    return rl_checks.problems(config, world_size, "accel-grpo", _check_algorithm(config))
