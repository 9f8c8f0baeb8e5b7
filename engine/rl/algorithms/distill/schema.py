"""On-policy distillation's config schema (the RL layer's shared sections, ``engine/rl/schema.py``, and its own
``teacher.*``, ``distill.*`` and ``algorithm.*``) and presets. ``cpu-demo``: a student of the built-in character
model distilled on the echo task from a larger teacher that ``accel-sft`` trains once (``demo.py``)."""

from __future__ import annotations

import dataclasses

from ...model import BUILTIN_MODEL
from ...rollout_correction import DEFAULT_CAP, DEFAULT_CORRECTION
from ...schema import RLConfig
from .teacher import TeacherConfig

DEMO_TEACHER = "builtin:echo-teacher"  # teacher.path of the demo: made by accel-sft on first use (demo.py)


@dataclasses.dataclass
class DistillSection:
    # > 0 adds the task's reward to every token's advantage: coef x (the response's reward - its group's mean).
    # 0 (the default): the teacher alone, and prompts need no answer.
    reward_coef: float = 0.0


@dataclasses.dataclass
class AlgorithmConfig:
    loss_agg: str = "token-mean"  # how the per-token policy-gradient values become the loss (algorithm.loss_agg)
    clip_low: float = 0.2  # PPO's ratio clip, when a step makes several updates (one update: the ratio is 1)
    clip_high: float = 0.2
    mask_truncated: bool = False  # responses cut at rollout.max_new_tokens get no loss
    # Importance sampling against the rollout engine's own log-probs (engine/rl/rollout_correction.py): the modes
    # and the cap as in GRPO's algorithm section.
    rollout_correction: str = DEFAULT_CORRECTION
    rollout_correction_cap: float = DEFAULT_CAP


@dataclasses.dataclass
class DistillConfig(RLConfig):
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
    trainer: str = "distill"
    teacher: TeacherConfig = dataclasses.field(default_factory=TeacherConfig)
    distill: DistillSection = dataclasses.field(default_factory=DistillSection)


PRESETS: dict[str, dict] = {
    "default": {},  # the schema's own values: the library defaults, for a user's student, teacher and data
    # The student (the built-in character model, hidden 64) learns the echo task from a teacher twice its width
    # that accel-sft trained on the task's answers; the reward is only measured (distill.reward_coef=0).
    "cpu-demo": {
        "nproc": 2,
        "model": {"path": BUILTIN_MODEL, "hidden_size": 64, "layers": 2},
        "teacher": {"path": DEMO_TEACHER, "param_offload": False},
        "data": {"task": "echo"},
        "rollout": {"n": 8, "temperature": 1.0, "max_new_tokens": 4},
        "train": {"steps": 150, "prompts_per_step": 16, "micro_batch_size": 64},
        "engine": {"fsdp_version": 2, "lr": 5e-3, "max_grad_norm": 1.0},
    },
}


def _accelerator_preset(micro_batch_tokens: int) -> dict:
    """Real models on GPUs/NPUs: a local student, teacher and prompts are required (model.path=, teacher.path= or
    teacher.server_url=, data.path=)."""
    return {
        "nproc": "auto",
        "model": {"path": None},
        "data": {"task": "gsm8k", "path": None, "max_prompt_tokens": 512},
        "rollout": {"n": 4, "temperature": 1.0, "max_new_tokens": 512},
        "train": {"steps": 200, "prompts_per_step": 64, "micro_batch_tokens": micro_batch_tokens},
        "engine": {"fsdp_version": 2, "lr": 1e-6, "mixed_precision": "auto", "gradient_checkpointing": True},
    }


PRESETS["h100"] = _accelerator_preset(micro_batch_tokens=8192)  # 80 GB HBM
PRESETS["ascend-910b"] = _accelerator_preset(micro_batch_tokens=4096)  # 64 GB HBM
