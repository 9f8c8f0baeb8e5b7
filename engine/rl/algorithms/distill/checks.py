"""``accel-distill``'s help and its checks before any worker (its own keys, then the teacher against the student),
and its inputs (the demo's teacher made first)."""

from __future__ import annotations

from ...checks import problems
from .schema import DEMO_TEACHER

HELP = """On-policy distillation of a causal language model: the student samples responses to prompts, a frozen
teacher (a larger model sharing the student's tokenizer) scores the student's own tokens, and each token's
advantage is the reverse KL on it, -(log p_student - log p_teacher), optionally plus a task reward
(distill.reward_coef). The teacher runs in our engine (teacher.path, sharded and offloadable like the reference
model) or on a vLLM server (teacher.server_url, its prompt log-probs).

With no arguments: the CPU demo (2 processes; a tiny student learns the echo task from a teacher that accel-sft
trains once, in a few minutes).

examples:
  accel-distill                                   # the CPU demo
  accel-distill model.path=/models/Qwen3-0.6B teacher.path=/models/Qwen3-8B data.path=/data/prompts.jsonl
  accel-distill --preset h100 model.path=/models/Qwen3-0.6B teacher.server_url=http://host:8000 data.path=p.jsonl
  accel-distill --resume run.name=distill-cpu-demo-20261203-101500
  accel-distill export runs/NAME /models/NAME-hf  # a checkpoint as a Hugging Face model directory

Metrics: distill/reverse_kl, distill/teacher_s and the rollout figures; options and when each teacher pays:
docs/distill.md.
"""


def check(config, world_size: int, tool: str) -> list[str]:
    """The keys on their own first; once they hold, the teacher against the student."""
    found = problems(config, world_size, tool, algorithm_problems(config))
    if found:
        return found
    return teacher_problems(config)


def load_inputs(config, verbose: bool):
    """The demo's teacher made first (once; config.json records the directory made), then the inputs."""
    from .inputs import load_inputs

    if config.teacher.path == DEMO_TEACHER:
        from .demo import echo_teacher

        config.teacher.path = echo_teacher(config.run.output_dir, verbose=verbose)
    return load_inputs(config, verbose=verbose)


def algorithm_problems(config) -> list[str]:
    """``teacher.*``, ``distill.*`` and ``algorithm.*`` on their own."""
    from ...losses import AGGREGATION_MODES
    from .teacher import source_problems

    found = [] if config.teacher.path == DEMO_TEACHER else source_problems(config.teacher)
    a = config.algorithm
    if a.loss_agg not in AGGREGATION_MODES:
        found.append(f"algorithm.loss_agg must be one of {', '.join(AGGREGATION_MODES)}, got {a.loss_agg!r}")
    if not (a.clip_low >= 0 and a.clip_high >= 0):
        found.append(f"algorithm.clip_low and clip_high must be >= 0, got {a.clip_low} and {a.clip_high}")
    if config.distill.reward_coef < 0:
        found.append(f"distill.reward_coef must be >= 0, got {config.distill.reward_coef}")
    return found


def teacher_problems(config) -> list[str]:
    """The teacher against the student, before any worker: the same tokenizer (and, served, sampling its log-probs
    follow)."""
    from ...model import build_model

    if config.teacher.path == DEMO_TEACHER:
        return []  # made by the plan, with the student's tokenizer
    student = build_model(config.model)[0]
    if config.teacher.path:
        from .teacher import path_problems

        return path_problems(config, student)
    from ...server_logprobs import server_problems

    return server_problems(config.teacher, config.rollout, student)
