"""A step's training data: every rank's sequences gathered once, cut into global mini-batches, each planned into
every rank's micro-batches.

Rollout, rewards and advantages stay on the rank that sampled a group. Then one exchange
(``engine.runtime.all_gather_rows``) gives every rank the whole step's batch, in rank order. Mini-batch ``j`` is
a fixed slice of that global batch, whatever the number of ranks, so a preset makes the same optimizer updates on
1, 2 or 8 ranks; the packing planner (``engine.packing``) splits each mini-batch into micro-batches, the same
number on every rank, within the token budget and balanced by tokens. Every rank computes the same plans from the
same lengths; the reference and old log-prob passes use them too, so each rank scores exactly the sequences it
will train on and nothing moves again. With sequence parallelism "rank" here is a data-parallel group: the ranks
of one group get the same micro-batches (each computes its slice of them) and the token budget counts the group's
tokens.
"""

from __future__ import annotations

import dataclasses

import torch

from ..packing import Layout, Plan, SequenceBatch, build_layout, plan_micro_batches
from ..runtime import all_gather_rows
from .micro_batch import PolicyMicroBatch
from .rollout_correction import MismatchStats
from .sizes import mini_batch_sequences
from .terms import MiniBatchSize


@dataclasses.dataclass(frozen=True)
class Batching:
    """How a step's sequences become updates and micro-batches."""

    mini_batch_sequences: int  # sequences per optimizer update, over all ranks
    group_size: int  # rollout.n: mini-batches are cut between groups where the counts allow
    micro_batch_tokens: int | None  # the token budget per micro-batch per rank (None: by count)
    micro_batch_size: int  # sequences per micro-batch per rank, when there is no token budget
    packed: bool  # one row per micro-batch (padding-free), else padded rows


def batching_for(config, world_size: int, packed: bool) -> Batching:
    train = config.train
    return Batching(mini_batch_sequences(config, world_size), config.rollout.n, train.micro_batch_tokens,
                    train.micro_batch_size, packed)


@dataclasses.dataclass
class MiniBatch:
    indices: range  # sequences of the global batch
    plan: Plan  # micro-batches of every rank, indices into the global batch


@dataclasses.dataclass
class StepData:
    """The step's global batch (every rank's sequences), its mini-batches, and this rank's log-probs."""

    sequences: SequenceBatch  # prompt + response, the response scored
    loss_mask: torch.Tensor  # [N, R] long: response tokens that count in the loss
    advantages: torch.Tensor  # [N] (per sequence) or [N, R] (per token)
    mini_batches: list[MiniBatch]
    rank: int  # the data-parallel group's (the rank's without sequence parallelism)
    packed: bool
    old_log_probs: torch.Tensor | None = None  # [N, R]; None: one update per step, the policy's own are the old ones
    sampling_log_probs: torch.Tensor | None = None  # [N, R]: the rollout engine's, when it returned them
    pad_tokens: dict[str, int] = dataclasses.field(default_factory=dict)  # counted per pass, on this rank
    # [N, R] each: frozen models' log-probs by name (``ref``: the KL reference; a distillation teacher)
    frozen_log_probs: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    step: int = 0  # the step (0-based) whose batch it is
    # What the algorithm keeps of the step for its ``after_update`` (PPO: the GAE returns, the critic's values).
    kept: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    @property
    def ref_log_probs(self) -> torch.Tensor | None:
        """The reference's log-probs (``frozen_log_probs["ref"]``), when the step has them."""
        return self.frozen_log_probs.get("ref")

    @ref_log_probs.setter
    def ref_log_probs(self, values: torch.Tensor | None) -> None:
        if values is None:
            self.frozen_log_probs.pop("ref", None)
        else:
            self.frozen_log_probs["ref"] = values

    @property
    def width(self) -> int:
        """R: the longest response of the step."""
        return self.loss_mask.size(1)

    def own_rows(self) -> list[int]:
        """The sequences of this rank's micro-batches (its data-parallel group's), ascending: the rows its log-prob
        passes fill."""
        return sorted({i for mini in self.mini_batches for micro in mini.plan.ranks[self.rank] for i in micro})

    def layouts(self, mini: MiniBatch) -> list[tuple[tuple[int, ...], Layout]]:
        """This rank's micro-batches of ``mini``: (sequence indices, model inputs) each."""
        return [(indices, build_layout(self.sequences, indices, self.packed)) for indices in mini.plan.ranks[self.rank]]

    def rank_layouts(self):
        """This rank's micro-batches of every mini-batch, in update order (for the log-prob passes)."""
        for mini in self.mini_batches:
            yield from self.layouts(mini)

    def count_pad_tokens(self, what: str, micro: Layout) -> None:
        self.pad_tokens[what] = self.pad_tokens.get(what, 0) + micro.pad_tokens

    def micro_batches(self, mini: MiniBatch, record_mismatch: bool = False) -> list[PolicyMicroBatch]:
        """This rank's micro-batches of ``mini`` as the step function takes them (host tensors), with the
        mini-batch's sizes; ``record_mismatch``: each records its own rollout/trainer mismatch."""
        size = MiniBatchSize(mini.plan.non_empty, float(self.loss_mask[mini.indices.start:mini.indices.stop].sum()),
                             len(mini.indices))
        micro_batches = []
        for indices, micro in self.layouts(mini):
            self.count_pad_tokens("update", micro)
            rows, width = list(indices), micro.width

            def part(tensor, rows=rows, width=width):
                if tensor is None:
                    return None
                if not rows:  # a filler: nothing counts
                    return tensor.new_zeros((1, width) if tensor.dim() == 2 else (1,))
                return tensor[rows, :width] if tensor.dim() == 2 else tensor[rows]

            micro_batches.append(PolicyMicroBatch(
                micro, part(self.loss_mask), part(self.advantages), part(self.old_log_probs),
                {name: part(values) for name, values in self.frozen_log_probs.items()},
                part(self.sampling_log_probs), mini.plan.non_empty, size,
                MismatchStats() if record_mismatch else None))
        return micro_batches

    def plan_metrics(self) -> dict[str, float]:
        """Micro-batches per rank per update (mean over the step's updates) and the worst token imbalance."""
        return {"micro_batches": sum(m.plan.micro_batches for m in self.mini_batches) / len(self.mini_batches),
                "token_imbalance": max(m.plan.imbalance for m in self.mini_batches),
                "packed": float(self.packed)}


def rank_sequences(batch, advantages: torch.Tensor, trains: bool = True) -> dict[str, torch.Tensor]:
    """One rank's rollout (left-padded prompts, right-padded responses) as unpadded sequences, right-padded in
    storage: tokens, lengths, starts (the prompt's length), the loss mask, the advantages and the engine's
    log-probs when it returned them. ``trains=False``: the rows only keep the exchange's shapes (a rank with
    nothing to train on) and are left out of the step."""
    prompt_width = batch.prompt_length
    prompt_lengths = batch.attention_mask[:, :prompt_width].sum(dim=1)
    response_lengths = batch.attention_mask[:, prompt_width:].sum(dim=1)  # up to and including the first EOS
    lengths = prompt_lengths + response_lengths
    tokens = torch.zeros(len(batch), int(lengths.max()), dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompt_lengths.tolist(), response_lengths.tolist(), strict=True)):
        tokens[row, :p + r] = batch.input_ids[row, prompt_width - p:prompt_width + r]
    rows = {"tokens": tokens, "lengths": lengths, "starts": prompt_lengths,
            "loss_mask": batch.response_mask.long(), "advantages": advantages.float(),
            "trains": torch.full((len(batch),), int(trains), dtype=torch.long)}
    if batch.sampling_log_probs is not None:
        rows["sampling_log_probs"] = batch.sampling_log_probs.float()
    return rows


def mini_batch_ranges(total: int, size: int, group_size: int) -> list[range]:
    """``total // size`` (at least one) near-equal consecutive slices, cut between groups when groups are whole."""
    count = max(1, total // size)
    unit = group_size if total % group_size == 0 else 1
    units = total // unit
    bounds = [round(i * units / count) * unit for i in range(count + 1)]
    return [range(start, end) for start, end in zip(bounds, bounds[1:], strict=False) if end > start]


def plan_updates(sequences: SequenceBatch, batching: Batching, world_size: int) -> list[MiniBatch]:
    """The step's mini-batches, each planned into every rank's micro-batches (indices into the global batch)."""
    lengths = sequences.lengths.tolist()
    mini_batches = []
    for indices in mini_batch_ranges(len(sequences), batching.mini_batch_sequences, batching.group_size):
        plan = plan_micro_batches([lengths[i] for i in indices], world_size, max_tokens=batching.micro_batch_tokens,
                                  max_sequences=None if batching.micro_batch_tokens else batching.micro_batch_size,
                                  padded=not batching.packed)
        shifted = tuple(tuple(tuple(indices.start + i for i in micro) for micro in ranks) for ranks in plan.ranks)
        mini_batches.append(MiniBatch(indices, dataclasses.replace(plan, ranks=shifted)))
    return mini_batches


def gather_step_data(local: dict[str, torch.Tensor], batching: Batching, rank: int, world_size: int,
                     device: torch.device) -> StepData:
    """Exchange every rank's ``rank_sequences`` once and plan the step's updates (the same plans on every rank)."""
    everyone = all_gather_rows(local, device)
    trains = everyone.pop("trains", None)
    if trains is not None and not trains.all():  # placeholder rows of ranks with nothing to train on
        everyone = {name: tensor[trains.bool()] for name, tensor in everyone.items()}
    sequences = SequenceBatch(everyone["tokens"], everyone["lengths"], everyone["starts"])
    return StepData(sequences, everyone["loss_mask"], everyone["advantages"],
                    plan_updates(sequences, batching, world_size), rank, batching.packed,
                    sampling_log_probs=everyone.get("sampling_log_probs"))
