"""Reward functions for the accel-grpo tests (named on the command line as grpo_rewards:NAME)."""

import os


def explode_on_rank1(prompt, response, answer):
    if os.environ.get("RANK") == "1":
        raise RuntimeError("reward service unreachable")
    return 0.0


def die_on_rank1(prompt, response, answer):
    if os.environ.get("RANK") == "1":
        os._exit(7)  # a hard crash: no exception, no cleanup
    return 0.0


def not_a_number(prompt, response, answer):
    return float("nan")
