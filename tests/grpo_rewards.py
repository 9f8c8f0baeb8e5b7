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


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl style: 1.0 for the right final number; a dict with a score, as verl's reward managers accept."""
    from engine.rl.prompts import final_number

    assert data_source == "openai/gsm8k" and isinstance(extra_info, dict), (data_source, extra_info)
    return {"score": 1.0 if final_number(solution_str) == final_number(ground_truth) else 0.0}


def length_penalty(prompts, completions, **columns):
    """TRL style: batched; completions are chat messages when the prompts are."""
    assert "reward_model" in columns and len(columns["reward_model"]) == len(prompts)
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [-len(text) / 100.0 for text in texts]


def short_reply(prompt, response, answer):
    """Simple style: rewards short responses, so that a tiny random model has something to learn."""
    return 1.0 if len(response) <= 8 else 0.0


def wrong_signature(text):
    return 0.0


_calls = 0


def flat_first_draw_on_rank1(prompt, response, answer):
    """Simple style: on rank 1 the first GRPO_FLAT_CALLS responses all score 0.0 (every group of its first draw is
    filtered by dynamic sampling); otherwise a score that differs between the responses of a group."""
    global _calls
    _calls += 1
    if os.environ.get("RANK") == "1" and _calls <= int(os.environ.get("GRPO_FLAT_CALLS", "0")):
        return 0.0
    return sum(map(ord, response)) % 7 / 7
