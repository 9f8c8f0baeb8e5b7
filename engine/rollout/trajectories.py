"""What a multi-turn rollout keeps per trajectory besides its tokens: the messages after the prompt (assistant
turns with their tool calls, tool results), the environment instance, and the counts behind the ``tools/*`` and
``rollout/*`` metrics. Rows follow the rollout batch's rows (selected and concatenated with it)."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Trajectories:
    completions: list[list[dict]]  # per row: the messages after the prompt, TRL's ``completions`` for chat data
    environments: list  # per row: its environment instance (None without rollout.environment)
    turns: torch.Tensor  # [B] model turns
    tool_calls: torch.Tensor  # [B] tool calls run
    tool_failures: torch.Tensor  # [B] calls whose result is an error (unknown tool, raised, timed out)
    tool_tokens: torch.Tensor  # [B] tool and template tokens inserted into the response (no loss on them)

    @property
    def instances(self) -> list | None:
        """The environments, for reward functions (None for a run with tools only)."""
        return self.environments if any(e is not None for e in self.environments) else None

    def select(self, rows: list[int]) -> Trajectories:
        index = torch.tensor(rows, dtype=torch.long)
        return Trajectories([self.completions[i] for i in rows], [self.environments[i] for i in rows],
                            self.turns[index], self.tool_calls[index], self.tool_failures[index],
                            self.tool_tokens[index])

    @staticmethod
    def concat(parts: list[Trajectories]) -> Trajectories:
        return Trajectories([c for p in parts for c in p.completions], [e for p in parts for e in p.environments],
                            *(torch.cat([getattr(p, name) for p in parts])
                              for name in ("turns", "tool_calls", "tool_failures", "tool_tokens")))

    def sums(self) -> dict[str, float]:
        """This rank's totals, summed over ranks for ``tools/*``, ``rollout/turns_mean``, ``rollout/tool_tokens``."""
        return {"agent_turns": float(self.turns.sum()), "agent_tool_calls": float(self.tool_calls.sum()),
                "agent_tool_failures": float(self.tool_failures.sum()),
                "agent_tool_tokens": float(self.tool_tokens.sum())}


def metrics(totals: dict[str, float]) -> dict[str, float]:
    """The step's agent metrics from ``sums`` summed over ranks (absent when the run has no tools)."""
    if "agent_turns" not in totals:
        return {}
    count, calls = totals["sequences"], totals["agent_tool_calls"]
    return {"tools/call_frequency": calls / count,  # tool calls per trajectory
            "tools/failure_frequency": totals["agent_tool_failures"] / max(calls, 1.0),  # failed share of the calls
            "rollout/turns_mean": totals["agent_turns"] / count,
            "rollout/tool_tokens": totals["agent_tool_tokens"]}
