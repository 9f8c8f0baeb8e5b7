"""``accel-distill``'s recipe: on-policy distillation on the RL layer (``engine/rl``) and the frame
(``engine/train``). What is distillation's own: the schema and presets (``schema.py``), the teacher's checks
(here, before any worker), the algorithm (``algorithm.py``), the trainer (``trainer.py``) and the demo's teacher
(``demo.py``)."""

from __future__ import annotations

from ...rl.checks import problems
from ...rl.recipe import RLRecipe
from .schema import DEMO_TEACHER, PRESETS, DistillConfig

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


class DistillRecipe(RLRecipe):
    name, tool, help = "distill", "accel-distill", HELP
    schema, presets = DistillConfig, PRESETS
    sections = "model, teacher, distill, data, rollout, algorithm, train, run, engine"
    example = "teacher.path=/models/teacher train.steps=10"
    algorithm = "engine.recipes.distill.algorithm:DistillAlgorithm"
    path_keys = (*RLRecipe.path_keys, "teacher.path")
    curves = (("reward_mean", "reward"), ("distill/reverse_kl", "reverse KL to the teacher"),
              ("response_length", "response length"), ("grad_norm", "grad norm"))
    resume_fixed = {**RLRecipe.resume_fixed, "teacher": "the teacher the run distils from",
                    "distill.reward_coef": "what the advantages are"}

    def check(self, config, world_size):
        found = problems(config, world_size, self.tool, algorithm_problems(config))
        if found:
            return found
        return teacher_problems(config)

    def plan(self, config, world_size, *, verbose):
        from ...train.loggers import require_loggers
        from .inputs import load_inputs

        require_loggers(config.run.loggers)
        if config.teacher.path == DEMO_TEACHER:  # config.json records the directory made
            from .demo import echo_teacher

            config.teacher.path = echo_teacher(config.run.output_dir, verbose=verbose)
        return self.plan_of(config, world_size, load_inputs(config, verbose=verbose))


def algorithm_problems(config) -> list[str]:
    """``teacher.*``, ``distill.*`` and ``algorithm.*`` on their own."""
    from ...rl.losses import AGGREGATION_MODES
    from ...rl.teacher import source_problems

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
    from ...rl.model import build_model

    if config.teacher.path == DEMO_TEACHER:
        return []  # made by the plan, with the student's tokenizer
    student = build_model(config.model)[0]
    if config.teacher.path:
        from ...rl.teacher import path_problems

        return path_problems(config, student)
    from ...rl.server_logprobs import server_problems

    return server_problems(config.teacher, config.rollout, student)
