"""PPO's critic on the RL step: its values of the step's response tokens (before the policy's update, for GAE) and
its own updates after the policy's (the clipped value loss fitted to the GAE returns, its own optimizer), each over
the critic's micro-batches (``critic.micro_batch_*``, else the policy's)."""

from __future__ import annotations

import dataclasses

import torch

from ....runtime import phase
from .critic import own_micro_batches, token_values, value_loss


def critic_layouts(config, data, mini) -> list:
    """The critic's micro-batches of ``mini`` on this rank: its own sizes (``critic.micro_batch_*``), else the
    policy's."""
    c = config.critic
    if c.micro_batch_size is None and c.micro_batch_tokens is None:
        return data.layouts(mini)
    ranks = own_micro_batches(mini.plan.ranks, data.sequences.lengths.tolist(), max_sequences=c.micro_batch_size,
                              max_tokens=c.micro_batch_tokens, padded=not data.packed)
    return data.layouts(dataclasses.replace(mini, plan=dataclasses.replace(mini.plan, ranks=ranks)))


def planned_values(critic, config, data, device) -> torch.Tensor:
    """The critic's values ``[N, R]`` of this rank's share of the step's sequences (others' rows 0)."""
    out = torch.zeros(len(data.sequences), data.width)
    with critic.eval_mode(), torch.no_grad():
        for indices, micro in (layout for mini in data.mini_batches for layout in critic_layouts(config, data, mini)):
            values = token_values(critic.module, micro.to(device)).cpu()
            if indices:
                out[list(indices), :values.size(1)] = values
    return out


def critic_micro_batches(config, data, mini, returns: torch.Tensor, values: torch.Tensor) -> list[dict]:
    micro_batches = []
    for indices, layout in critic_layouts(config, data, mini):
        rows, width = list(indices), layout.width

        def part(tensor, rows=rows, width=width):
            return tensor[rows, :width] if rows else tensor.new_zeros((1, width))

        micro_batches.append({"layout": layout, "mask": part(data.loss_mask), "returns": part(returns),
                              "old_values": part(values)})
    return micro_batches


def update_critic(critic, config, data, device) -> dict:
    """The critic's updates of a step (``critic.ppo_epochs``, else ``train.ppo_epochs``, passes over the step's
    mini-batches) on ``data.kept``'s returns and values; its ``critic/*`` figures."""
    returns, values = data.kept["returns"], data.kept["old_values"]

    def loss_fn(module, micro: dict):
        predicted = token_values(module, micro["layout"].to(device))
        mask = micro["mask"].to(device)
        loss, metrics = value_loss(predicted, micro["old_values"].to(device), micro["returns"].to(device), mask,
                                   clip_range=config.algorithm.value_clip)
        return loss, mask.sum(), metrics  # a count, left on the device (read with the step's sums)

    epochs = config.critic.ppo_epochs or config.train.ppo_epochs
    totals: dict[str, float] = {}
    updates = 0
    with phase("critic_update"), critic.train_mode():
        for _ in range(epochs):
            for mini in data.mini_batches:
                metrics = critic.forward_backward_batch(critic_micro_batches(config, data, mini, returns, values),
                                                        loss_fn)
                micro_batches = metrics.pop("micro_batches", 0.0)
                for key in ("peak_memory_gib", "weight", "time_s"):  # the engine's own
                    metrics.pop(key, None)
                metrics["micro_batches"] = float(micro_batches)
                metrics["grad_norm"] = critic.optimizer_step()
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
                updates += 1
    mask = data.loss_mask.bool()
    figures = {f"critic/{key}": value / updates for key, value in totals.items()}
    figures["critic/vf_loss"] = figures.pop("critic/loss")
    figures["critic/lr"] = critic.last_step_metrics["lr"]
    figures["critic/returns_mean"] = float(returns[mask].mean()) if mask.any() else 0.0
    return figures
