"""On-policy distillation as an RL algorithm (``engine/rl/algorithm.py``): the student samples, a frozen teacher
scores the student's own tokens, and each response token's advantage is the reverse KL on the sampled token,

    A_t = -(log p_student(y_t) - log p_teacher(y_t))  [+ distill.reward_coef x (r - mean r of the group)],

trained with the policy gradient. The advantage is formed inside the loss from the sampling policy's log-probs
(with one update a step the policy's own, detached: no extra forward) and the teacher's, so a teacher equal to the
student gives exactly 0 everywhere and an update changes nothing. Reported: ``distill/reverse_kl`` (its mean over
response tokens) and ``distill/advantage_abs`` (the mean |A_t|)."""

from __future__ import annotations

import dataclasses

import torch

from ...algorithm import Algorithm
from ...formulas import grpo_advantages
from ...losses import aggregate_loss
from ...terms import Norm, Term, policy_gradient
from . import checks
from .schema import PRESETS, DistillConfig
from .teacher import teacher_spec

TEACHER = "teacher"  # the frozen model's name: its log-probs are the step's frozen_log_probs["teacher"]


class DistillAlgorithm(Algorithm):
    tool, help, schema, presets = "accel-distill", checks.HELP, DistillConfig, PRESETS
    sections = "model, teacher, distill, data, rollout, algorithm, train, run, engine"
    example = "teacher.path=/models/teacher train.steps=10"
    path_keys = ("teacher.path",)
    curves = (("reward_mean", "reward"), ("distill/reverse_kl", "reverse KL to the teacher"),
              ("response_length", "response length"), ("grad_norm", "grad norm"))
    resume_fixed = {"teacher": "the teacher the run distils from", "distill.reward_coef": "what the advantages are"}
    metric_aliases = {f"frozen/{TEACHER}_s": "distill/teacher_s"}  # the teacher's forward, under its first name

    @classmethod
    def check(cls, config, world_size, tool):
        return checks.check(config, world_size, tool)

    @classmethod
    def load_inputs(cls, config, verbose):
        return checks.load_inputs(config, verbose)

    @property
    def mask_truncated(self) -> bool:
        return self.config.algorithm.mask_truncated

    def frozen_models(self, world_size: int) -> dict:
        teacher = self.config.teacher
        if teacher.server_url:
            from ...frozen import FrozenSpec
            from ...server_logprobs import ServerFrozenModel

            def served(name: str) -> ServerFrozenModel:
                return ServerFrozenModel(name, teacher.server_url, teacher.server_model, teacher.timeout_s)

            return {TEACHER: FrozenSpec(None, build=served)}
        return {TEACHER: teacher_spec(self.config, world_size)}

    def advantages(self, scored, context, leads: bool) -> torch.Tensor:
        """The task reward's share of each response's advantage (0 unless ``distill.reward_coef``)."""
        coef = self.config.distill.reward_coef
        if not coef:
            return torch.zeros(len(scored))
        return coef * grpo_advantages(scored.rewards, torch.arange(len(scored)) // scored.n, scale="none")

    def terms(self) -> list[Term]:
        a = self.config.algorithm
        return [reverse_kl_policy_gradient(Norm(a.loss_agg), clip_low=a.clip_low, clip_high=a.clip_high)]


def reverse_kl_policy_gradient(norm: Norm, *, clip_low: float, clip_high: float) -> Term:
    """The clipped policy gradient of the per-token advantage ``sequence advantage - (old - teacher)`` (reported as
    ``pg_loss``, ``distill/reverse_kl``, ``distill/advantage_abs``); rollout correction's weights apply."""
    gradient = policy_gradient(norm, clip_low=clip_low, clip_high=clip_high)

    def per_token(streams, weights):
        gap = (streams.old_log_probs - streams.frozen[TEACHER]) * streams.mask  # log p_student - log p_teacher
        sequence = streams.advantages
        advantages = (sequence.unsqueeze(-1) if sequence.dim() == 1 else sequence) * streams.mask - gap
        values, metrics = gradient.per_token(dataclasses.replace(streams, advantages=advantages), weights)

        def mean(tensor):  # left on the device: the engine reads the step's sums once
            return aggregate_loss(tensor.detach(), streams.mask, "token-mean", counts=streams.counts)

        metrics.update({"distill/reverse_kl": mean(gap), "distill/advantage_abs": mean(advantages.abs())})
        return values, metrics

    return Term(per_token, norm=norm, metric="pg_loss", corrected=True)
