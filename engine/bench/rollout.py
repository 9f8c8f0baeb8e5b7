"""Rollout: tokens per second of ``FSDPEngine.generate`` and the all-gathers one call issues, per length."""

from __future__ import annotations

import torch

from .. import EngineConfig, FSDPEngine
from .common import CommCounter, interleave, model_factory, summary, timed


def run(options, backend, rank) -> dict:
    engine = FSDPEngine(model_factory(options), EngineConfig(fsdp_version=options["fsdp_version"], lr=1e-4,
                                                             mixed_precision=options["mixed_precision"]), backend)
    g = torch.Generator().manual_seed(rank)
    prompts = torch.randint(1, options["vocab"], (options["rollout_batch"], 8), generator=g).to(backend.device())

    def generate(new_tokens: int):
        return engine.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                               max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
                               synced_gpus=engine.world_size > 1)

    counts, lengths = {}, options["rollout_tokens"]
    with engine.eval_mode():
        for new_tokens in lengths:
            generate(new_tokens)  # warm-up
            with CommCounter() as comm:
                output = generate(new_tokens)
            if output.size(1) != prompts.size(1) + new_tokens:
                raise RuntimeError(f"generate stopped after {output.size(1) - prompts.size(1)} of {new_tokens} "
                                   "tokens: the rollout figures would not be per token")
            counts[new_tokens] = comm.as_dict()
        samples = interleave({n: (lambda n=n: timed(lambda: generate(n), backend.synchronize)) for n in lengths},
                             options["steps"])
    result = {"batch": options["rollout_batch"], "prompt_tokens": prompts.size(1),
              "sharded_units": engine.num_sharded_units}
    for new_tokens, values in samples.items():
        row = summary(values)
        tokens = options["rollout_batch"] * new_tokens
        row.update(new_tokens=new_tokens, tokens_per_s_per_rank=tokens / (row["median_ms"] / 1e3),
                   collectives=counts[new_tokens],
                   all_gathers_per_call=counts[new_tokens]["all_gather"],
                   all_gathers_per_new_token=counts[new_tokens]["all_gather"] / new_tokens)
        result[f"new_tokens_{new_tokens}"] = row
    return result
