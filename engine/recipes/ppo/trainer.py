"""PPO's trainer: the RL step (``engine/rl/step.py``) with a critic, a second trained engine. After the step's
batch is gathered the critic's values of the response tokens and GAE (``engine.grpo.algorithms.gae_advantages``'
recursion, the advantages whitened over the global batch) give per-token advantages; the policy's update is the
RL step's (``algorithm.py``'s terms), then the critic's own updates fit its values to the returns (clipped value
loss) with its own optimizer. For the first ``critic.warmup_steps`` steps only the critic trains. The frame's loop
checkpoints both engines as one step (``parts.engines``); export writes the policy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ... import FSDPEngine
from ...rl.advantages import outcome_token_rewards, whiten
from ...rl.batches import StepData
from ...rl.critic import critic_factory, own_micro_batches, token_values, value_loss
from ...rl.engine_settings import engine_config
from ...rl.gae import gae_returns
from ...rl.model import build_model
from ...rl.step import RLTrainer
from ...rl.update import ppo_updates
from ...runtime import phase
from .algorithm import PPOAlgorithm

WARMUP_UPDATE = {"loss": 0.0, "pg_loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "entropy": 0.0, "grad_norm": 0.0,
                 "lr": 0.0, "updates": 0.0, "skipped_updates": 0.0, "peak_memory_gib": 0.0}


def critic_engine_config(config, world_size: int):
    """The policy's engine options with the critic's learning rate and offload (no LoRA: the critic trains whole)."""
    c = config.critic
    return dataclasses.replace(engine_config(config, world_size), lr=c.lr, param_offload=c.param_offload,
                               optimizer_offload=c.optimizer_offload, lora_rank=0)


@dataclasses.dataclass
class CriticStepData(StepData):
    """The step's batch with what the critic's update needs from the step's collection: the step (the policy waits
    for ``critic.warmup_steps``), the GAE returns and the values they came from (``[N, R]``, this rank's rows)."""

    step: int = 0
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    @classmethod
    def of(cls, data: StepData, **critic) -> CriticStepData:
        return cls(**{field.name: getattr(data, field.name) for field in dataclasses.fields(StepData)}, **critic)


class PPOTrainer(RLTrainer):
    recipe, tool = "ppo", "accel-ppo"

    def __init__(self, config, run_dir: Path | None = None, resume: bool = False, inputs=None) -> None:
        super().__init__(config, PPOAlgorithm(config), run_dir, resume, inputs)
        source = build_model(config.model)[1]
        self.critic = FSDPEngine(critic_factory(source, config.critic.path, config.train.seed),
                                 critic_engine_config(config, self.world_size), self.backend)

    @property
    def engines(self) -> dict:
        """Every trained engine, the policy first: the frame checkpoints and resumes them as one."""
        return {"policy": self.actor, "critic": self.critic}

    def critic_layouts(self, data, mini) -> list:
        """The critic's micro-batches of ``mini`` on this rank: its own sizes (``critic.micro_batch_*``), else the
        policy's."""
        c = self.config.critic
        if c.micro_batch_size is None and c.micro_batch_tokens is None:
            return data.layouts(mini)
        ranks = own_micro_batches(mini.plan.ranks, data.sequences.lengths.tolist(), max_sequences=c.micro_batch_size,
                                  max_tokens=c.micro_batch_tokens, padded=not data.packed)
        return data.layouts(dataclasses.replace(mini, plan=dataclasses.replace(mini.plan, ranks=ranks)))

    def planned_values(self, data) -> torch.Tensor:
        """The critic's values ``[N, R]`` of this rank's share of the step's sequences (others' rows 0)."""
        device = self.backend.device()
        out = torch.zeros(len(data.sequences), data.width)
        with self.critic.eval_mode(), torch.no_grad():
            for indices, micro in (layout for mini in data.mini_batches for layout in self.critic_layouts(data, mini)):
                values = token_values(self.critic.module, micro.to(device)).cpu()
                if indices:
                    out[list(indices), :values.size(1)] = values
        return out

    def collect(self, step: int, ahead=None, dropped=None):
        data, stats, extras = super().collect(step, ahead, dropped)
        a = self.config.algorithm
        own = data.own_rows()
        mask = data.loss_mask[own]
        with phase("values"):
            values = self.planned_values(data)
        raw, returns = gae_returns(outcome_token_rewards(data.advantages[own], mask), values[own], mask,
                                   gamma=a.gamma, lam=a.lam)

        def total(sums: dict) -> dict:
            return self.context.total(self.context.groups.once(sums))

        advantages = torch.zeros(data.loss_mask.shape)
        advantages[own] = whiten(raw, mask, total)  # over the global batch, each group's rows counted once
        full_returns = torch.zeros(data.loss_mask.shape)
        full_returns[own] = returns
        data.advantages = advantages
        return CriticStepData.of(data, step=step, returns=full_returns, old_values=values), stats, extras

    def critic_micro_batches(self, data, mini, returns: torch.Tensor, values: torch.Tensor) -> list[dict]:
        micro_batches = []
        for indices, layout in self.critic_layouts(data, mini):
            rows, width = list(indices), layout.width

            def part(tensor, rows=rows, width=width):
                return tensor[rows, :width] if rows else tensor.new_zeros((1, width))

            micro_batches.append({"layout": layout, "mask": part(data.loss_mask), "returns": part(returns),
                                  "old_values": part(values)})
        return micro_batches

    def critic_loss_fn(self, module, micro: dict):
        device = self.backend.device()
        values = token_values(module, micro["layout"].to(device))
        mask = micro["mask"].to(device)
        loss, metrics = value_loss(values, micro["old_values"].to(device), micro["returns"].to(device), mask,
                                   clip_range=self.config.algorithm.value_clip)
        return loss, mask.sum(), metrics  # a count, left on the device (read with the step's sums)

    def update_critic(self, data: CriticStepData) -> dict:
        returns, values = data.returns, data.old_values
        epochs = self.config.critic.ppo_epochs or self.config.train.ppo_epochs
        totals: dict[str, float] = {}
        updates = 0
        with phase("critic_update"), self.critic.train_mode():
            for _ in range(epochs):
                for mini in data.mini_batches:
                    metrics = self.critic.forward_backward_batch(
                        self.critic_micro_batches(data, mini, returns, values), self.critic_loss_fn)
                    micro_batches = metrics.pop("micro_batches", 0.0)
                    for key in ("peak_memory_gib", "weight", "time_s"):  # the engine's own
                        metrics.pop(key, None)
                    metrics["micro_batches"] = float(micro_batches)
                    metrics["grad_norm"] = self.critic.optimizer_step()
                    for key, value in metrics.items():
                        totals[key] = totals.get(key, 0.0) + value
                    updates += 1
        mask = data.loss_mask.bool()
        figures = {f"critic/{key}": value / updates for key, value in totals.items()}
        figures["critic/vf_loss"] = figures.pop("critic/loss")
        figures["critic/lr"] = self.critic.last_step_metrics["lr"]
        figures["critic/returns_mean"] = float(returns[mask].mean()) if mask.any() else 0.0
        return figures

    def update(self, data: CriticStepData, loss_fn=None) -> dict:
        """The policy's PPO updates (none during ``critic.warmup_steps``), then the critic's; its ``critic/*``
        figures join the step's row (``step_metrics.step_row`` keeps an update's keys with a ``/``)."""
        if data.step < self.config.critic.warmup_steps:
            from ...rl.rollout_correction import MismatchStats

            policy = {**WARMUP_UPDATE, "mismatch": MismatchStats()}
        else:
            with phase("update"):
                policy = ppo_updates(self.actor, data, loss_fn or self.loss_fn, self.config.train.ppo_epochs)
        policy.update(self.update_critic(data))
        return policy
