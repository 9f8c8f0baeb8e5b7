"""Packed against padded GRPO updates on the same rollout, interleaved: time, pad tokens, peak memory.

One rollout of the GRPO preset (``--grpo-case long``: responses spread over 1..128 tokens) gives the step's
sequences; the same update then runs in turn (packed, padded, rollout, packed, ...) as

* ``packed``: the trainer's micro-batches (``train.micro_batch_tokens``, else ``micro_batch_size`` sequences), each
  one row without padding;
* ``padded``: the planner's padded micro-batches under the same limits (the fallback path: similar lengths
  together, rows x longest within the budget);
* ``rollout``: what the trainer did before packing: ``micro_batch_size`` consecutive rows of the rank's own
  rollout, prompts left-padded and responses right-padded to the rank's longest.

A sample is one update: the forward and backward of every micro-batch and the optimizer step. Pad tokens are
counted from the inputs each variant built. Memory is measured as the bytes autograd keeps for the backward pass
(activations, parameters left out), largest over a variant's micro-batches: a count, the same on any machine, and
the part of an update's peak that micro-batching decides (the backend's peak, noisy on a CPU where it is the
process's resident memory, is in the JSON too). Then one packed update per token budget of ``--packing-budgets``:
a budget bounds the activations, where padded micro-batches are sized by their longest sequence.
"""

from __future__ import annotations

import time

import torch

from .common import interleave, ratio, summary

VARIANTS = ("packed", "padded", "rollout")


def _storage(tensor) -> tuple[int | None, int]:
    """(address, bytes) of a tensor's storage; ``(None, 0)`` where there is none to read (FSDP frees and swaps the
    storage of parameters it reshards: those are parameters, not activations)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    try:
        storage = local.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except RuntimeError:
        return None, 0


class SavedActivations:
    """Counts the bytes autograd saves for backward while open (each storage once; parameters left out)."""

    def __init__(self, module) -> None:
        self.parameters = {_storage(p)[0] for p in module.parameters()}
        self.bytes = 0
        self._seen: set[int] = set()

    def _pack(self, tensor):
        pointer, size = _storage(tensor)
        if pointer is not None and pointer not in self._seen and pointer not in self.parameters:
            self._seen.add(pointer)
            self.bytes += size
        return tensor

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def _measuring(step_fn, sizes: list):
    """``step_fn`` that appends the activation bytes of each micro-batch's forward to ``sizes``."""
    def measured(module, micro):
        with SavedActivations(module) as saved:
            result = step_fn(module, micro)
        sizes.append(saved.bytes)
        return result

    return measured


def _rollout_micro_batches(data, rank: int, rows_per_rank: int, size: int) -> list[dict]:
    """The pre-packing layout of this rank's own rows: consecutive ``size`` rows, left-padded prompts, responses
    right-padded, all as wide as the rank's longest prompt plus its longest response."""
    sequences = data.sequences
    rows = list(range(rank * rows_per_rank, (rank + 1) * rows_per_rank))
    prompt_width = int(sequences.starts[rows].max())
    response_width = int((sequences.lengths[rows] - sequences.starts[rows]).max())
    ids = torch.zeros(len(rows), prompt_width + response_width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for out, row in enumerate(rows):
        start, end = int(sequences.starts[row]), int(sequences.lengths[row])
        ids[out, prompt_width - start:prompt_width + end - start] = sequences.tokens[row, :end]
        mask[out, prompt_width - start:prompt_width + end - start] = 1
    loss_mask = data.loss_mask[rows, :response_width]
    return [{"input_ids": ids[s:s + size], "attention_mask": mask[s:s + size], "prompt_width": prompt_width,
             "loss_mask": loss_mask[s:s + size], "advantages": data.advantages[rows][s:s + size],
             "pad_tokens": mask[s:s + size].numel() - int(mask[s:s + size].sum())}
            for s in range(0, len(rows), size)]


def _rollout_step_fn(trainer, micro_batches_total: int):
    """The trainer's step function as it was before packing (left-padded log-probs, the same loss)."""
    from ..rl.formulas import aggregate_loss, micro_batch_scale, policy_loss
    from ..rl.logprobs import response_log_probs

    settings, device = trainer.algorithm.settings, trainer.backend.device()

    def step(module, micro):
        mask = micro["loss_mask"].to(device)
        log_probs, entropy = response_log_probs(module, micro["input_ids"].to(device),
                                                micro["attention_mask"].to(device), micro["prompt_width"],
                                                trainer.config.rollout.temperature, with_entropy=True)
        loss, metrics = policy_loss(log_probs, log_probs.detach(), micro["advantages"].to(device), mask,
                                    loss_mode=settings.loss_mode, clip_low=settings.clip_low,
                                    clip_high=settings.clip_high, clip_c=settings.clip_c, agg=settings.agg,
                                    norm_length=settings.norm_length)
        scale, weight = micro_batch_scale(mask, settings.agg, micro_batches_total)
        return loss * scale, weight, {"entropy": aggregate_loss(entropy, mask, "token-mean").item()}

    return step


def _timed_update(trainer, run) -> tuple[float, float]:
    """Seconds of one update and its peak memory (GiB) above what was allocated before it."""
    before = (trainer.backend.memory_stats().allocated or 0) / 2**30
    start = time.perf_counter()
    run()
    trainer.backend.synchronize()
    seconds = time.perf_counter() - start
    return seconds, trainer.actor.last_step_metrics["peak_memory_gib"] - before


def run(options, backend, rank) -> dict:
    import torch.distributed as dist

    from ..rl import batches
    from ..train.cli import load
    from ..train.registry import get_recipe

    overrides = ["run.progress=false", *options["grpo_overrides"]]
    recipe = get_recipe("grpo")
    config, _, _ = load(recipe, options["grpo_preset"], None, overrides)  # accel-bench printed its notices
    world_size = dist.get_world_size()
    problems = recipe.check(config, world_size)
    if problems:
        raise ValueError("the packing benchmark's settings are invalid: " + "; ".join(problems))
    trainer = recipe.trainer_of(config)
    data, _, _ = trainer.collect(step=0)
    data.old_log_probs = data.ref_log_probs = None  # the update alone is timed: its own log-probs are the old
    train = config.train
    limits = batches.batching_for(config, world_size, packed=True)
    padded_limits = batches.batching_for(config, world_size, packed=False)
    variants_data = {"packed": data, "padded": batches.StepData(
        data.sequences, data.loss_mask, data.advantages,
        batches.plan_updates(data.sequences, padded_limits, world_size), rank, packed=False)}
    rows_per_rank = len(data.sequences) // world_size
    legacy = _rollout_micro_batches(data, rank, rows_per_rank, train.micro_batch_size)
    activations = {name: [] for name in VARIANTS}
    legacy_step = _measuring(_rollout_step_fn(trainer, len(legacy) * world_size), activations["rollout"])
    pad_tokens = {"rollout": sum(m["pad_tokens"] for m in legacy)}
    peaks = {name: [] for name in VARIANTS}

    def update(name):
        def run_once():
            if name == "rollout":
                with trainer.actor.train_mode():
                    trainer.actor.forward_backward_batch(legacy, legacy_step)
                    trainer.actor.optimizer_step()
            else:
                variant = variants_data[name]
                variant.pad_tokens.clear()
                trainer.update(variant, loss_fn=_measuring(trainer.loss_fn, activations[name]))
                pad_tokens[name] = variant.pad_tokens.get("update", 0)

        def sample():
            seconds, peak = _timed_update(trainer, run_once)
            peaks[name].append(peak)
            return seconds

        return sample

    update("packed")()  # warm-up, not counted
    samples = interleave({name: update(name) for name in VARIANTS}, options["steps"])
    lengths = data.sequences.lengths.tolist()
    result = {"world_size": world_size, "sequences": len(lengths), "tokens": sum(lengths),
              "longest_sequence": max(lengths), "micro_batch_tokens": train.micro_batch_tokens,
              "micro_batch_size": train.micro_batch_size,
              "micro_batches_per_rank": {"packed": data.mini_batches[0].plan.micro_batches,
                                         "padded": variants_data["padded"].mini_batches[0].plan.micro_batches,
                                         "rollout": len(legacy)},
              "token_imbalance": data.mini_batches[0].plan.imbalance,
              "pad_tokens_per_update": pad_tokens,
              "update": {name: summary(values) for name, values in samples.items()},
              "peak_gib_above_start": {name: max(values) for name, values in peaks.items()},
              "activation_mib": {name: max(values) / 2**20 for name, values in activations.items()},
              "packed_over_padded": ratio(samples["packed"], samples["padded"]),
              "packed_over_rollout": ratio(samples["packed"], samples["rollout"])}
    budgets = {}
    for budget in options["packing_budgets"]:
        if budget < max(lengths):
            budgets[str(budget)] = {"skipped": f"below the longest sequence ({max(lengths)} tokens)"}
            continue
        planned = batches.Batching(limits.mini_batch_sequences, limits.group_size, budget, train.micro_batch_size,
                                   True)
        variant = batches.StepData(data.sequences, data.loss_mask, data.advantages,
                                   batches.plan_updates(data.sequences, planned, world_size), rank, packed=True)
        sizes: list[int] = []
        measured = _measuring(trainer.loss_fn, sizes)
        seconds, peak = _timed_update(trainer, lambda v=variant, f=measured: trainer.update(v, loss_fn=f))
        budgets[str(budget)] = {"activation_mib": max(sizes) / 2**20, "peak_gib_above_start": peak,
                                "seconds": seconds,
                                "micro_batches_per_rank": variant.mini_batches[0].plan.micro_batches}
    result["peak_by_budget"] = budgets
    return result
