"""``engine.grpo.tasks``: the built-in rewards at the path configs name them by (``data.reward=
engine.grpo.tasks:echo_reward``); they live in ``engine/rl/prompts.py``."""

from ..rl.prompts import EchoTask, echo_reward, final_number, gsm8k_reward  # noqa: F401
