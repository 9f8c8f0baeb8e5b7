"""``accel-ppo``'s help, curves and checks of its own keys (``algorithm.*``, ``critic.*``), before any worker; the
critic against the policy is ``critic_checks.py``."""

from __future__ import annotations

from ... import checks as rl_checks
from ...losses import AGGREGATION_MODES, KL_KINDS
from ...sizes import prompt_token_limit
from .critic_checks import critic_problems, path_problems

HELP = """PPO post-training of a causal language model with a learned critic (GAE advantages over the response's
tokens): the policy and a value model, each its own engine and optimizer, checkpointed together.

With no arguments: the CPU demo (2 processes, GRPO's tiny built-in model and synthetic task, with a critic).

examples:
  accel-ppo                                       # the CPU demo
  accel-ppo model.path=/models/Qwen2.5-0.5B-Instruct data.path=/data/gsm8k/train.parquet critic.lr=1e-5
  accel-ppo --resume run.name=ppo-cpu-demo-20261203-101500
  accel-ppo export runs/NAME /models/NAME-hf      # the policy, as a Hugging Face model directory

Options and metrics: docs/ppo.md.
"""

CURVES = (("reward_mean", "reward"), ("critic/vf_loss", "critic value loss"), ("pg_loss", "policy loss"))


def algorithm_problems(config) -> list[str]:
    a, c, problems = config.algorithm, config.critic, []
    if not 0 <= a.gamma <= 1 or not 0 <= a.lam <= 1:
        problems.append(f"algorithm.gamma and algorithm.lam must be in [0, 1], got {a.gamma} and {a.lam}")
    if not 0 <= a.clip_low < 1 or a.clip_high <= 0:
        problems.append(f"algorithm.clip_low must be in [0, 1) and algorithm.clip_high > 0, got {a.clip_low} and "
                        f"{a.clip_high}")
    if a.value_clip is not None and a.value_clip <= 0:
        problems.append(f"algorithm.value_clip must be > 0 or null (off), got {a.value_clip}")
    if a.loss_agg not in AGGREGATION_MODES:
        problems.append(f"algorithm.loss_agg must be one of {', '.join(AGGREGATION_MODES)}, got {a.loss_agg!r}")
    if a.kl_kind not in KL_KINDS:
        problems.append(f"algorithm.kl_kind must be one of {', '.join(KL_KINDS)}")
    for name in ("entropy_coeff", "kl_loss_coef"):
        if getattr(a, name) < 0:
            problems.append(f"algorithm.{name} must be >= 0, got {getattr(a, name)}")
    if c.lr <= 0 or c.warmup_steps < 0 or (c.ppo_epochs is not None and c.ppo_epochs < 1):
        problems.append("critic.lr must be > 0, critic.warmup_steps >= 0 and critic.ppo_epochs >= 1 (or null)")
    for name in ("micro_batch_size", "micro_batch_tokens"):
        value = getattr(c, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append(f"critic.{name} must be a positive integer or null (the policy's), got {value!r}")
    longest = prompt_token_limit(config)
    if isinstance(c.micro_batch_tokens, int) and longest is not None and \
            longest + config.rollout.max_new_tokens > c.micro_batch_tokens:
        problems.append(f"critic.micro_batch_tokens={c.micro_batch_tokens} is smaller than the longest possible "
                        f"sequence, {longest + config.rollout.max_new_tokens} tokens: raise it to at least that")
    elif c.micro_batch_tokens is not None and longest is None:
        problems.append("critic.micro_batch_tokens needs data.max_prompt_tokens (the longest prompt kept), as "
                        "train.micro_batch_tokens does")
    problems += path_problems(c.path)
    if config.engine.get("sequence_parallel_size", 1) not in (1, None):
        problems.append("accel-ppo does not run the critic with sequence parallelism yet: set "
                        "engine.sequence_parallel_size=1")
    if c.path:
        from ....checkpoint import pickled_weights_problems

        problems += pickled_weights_problems(c.path, "critic.path")  # a planted pytorch_model.bin: one line
    return problems


def check(config, world_size: int, tool: str) -> list[str]:
    found = rl_checks.problems(config, world_size, tool, algorithm_problems(config))
    return found or critic_problems(config)  # the critic against the policy, once the keys hold
