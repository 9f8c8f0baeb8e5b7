"""Rollout: ``FSDPEngine.generate``'s tokens per second and all-gathers per call; with ``--rollout-model`` the
rollout engines side by side on a model whose responses end at an EOS.

The engines part answers two questions on real, early-ending responses (a model directory such as ``accel-grpo
make-tiny-model DIR --hidden-size 128 --layers 4 --vocab-size 2048 --eos-bias 0.33 --single-eos``, whose sampled
responses spread over 1..128 tokens): how long a rollout call takes with ``hf`` (every row decodes until the
longest ends) and ``hf-continuous`` (finished rows leave the batch), and how many token positions each computes
for the tokens it produces. Both sample the same prompts from the same seed in each round. It also counts the
collectives of one call, before (``generate`` with ``synced_gpus``, an all-reduce per new token) and after.
Where vLLM is importable ``vllm`` joins them (``rollout.engine=vllm``: its own copy of the model, started from the
directory), with the time of a weight push (``FSDPEngine.iter_full_weights`` into the engine) per call.
"""

from __future__ import annotations

import importlib.util

import torch

from .. import EngineConfig, FSDPEngine
from .common import CommCounter, interleave, model_factory, ratio, summary, timed

ENGINES = ("hf", "hf-continuous")


def engines_here() -> tuple[str, ...]:
    """The engines compared: ``vllm`` too where it is installed."""
    return ENGINES + (("vllm",) if importlib.util.find_spec("vllm") else ())
QUESTIONS = ("How many apples does Tom have after he buys {a} more than his {b}?",
             "Maria reads {a} pages a day for {b} days. How many pages is that?",
             "A box holds {a} pencils and a bag {b}. How many pencils in all?",
             "Sam earns {a} dollars and spends {b}. How much is left?")


def run(options, backend, rank) -> dict:
    result = _generate_lengths(options, backend, rank)
    if options.get("rollout_model"):
        result["engines"] = _compare_engines(options, backend, rank)
    return result


def _generate_lengths(options, backend, rank) -> dict:
    engine = FSDPEngine(model_factory(options), EngineConfig(fsdp_version=options["fsdp_version"], lr=1e-4,
                                                             mixed_precision=options["mixed_precision"]), backend)
    g = torch.Generator().manual_seed(rank)
    prompts = torch.randint(1, options["vocab"], (options["rollout_batch"], 8), generator=g).to(backend.device())

    def generate(new_tokens: int):
        return engine.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                               max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)

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


def question_prompts(tokenizer, count: int, rank: int) -> list[list[int]]:
    """``count`` chat-formatted questions (different on each rank), as token ids."""
    texts = []
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)].format(a=3 + 7 * i + rank, b=11 + 5 * i)
        messages = [{"role": "user", "content": question}]
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                     if tokenizer.chat_template else question)
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _compare_engines(options, backend, rank) -> dict:
    from transformers import AutoTokenizer

    from ..rollout.engines import RolloutContext, SamplingConfig, create_rollout_engine
    from ..rollout.single_turn import eos_token_ids, sync_weights

    path = options["rollout_model"]
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    policy = FSDPEngine(path, EngineConfig(fsdp_version=options["fsdp_version"], lr=1e-4,
                                           mixed_precision=options["mixed_precision"]), backend)
    sampling = SamplingConfig(n=options["rollout_n"], max_new_tokens=options["rollout_max_new_tokens"],
                              eos_token_ids=tuple(eos_token_ids(policy.module, tokenizer)))
    prompts = question_prompts(tokenizer, options["rollout_prompts"], rank)
    names = engines_here()
    longest = max(len(p) for p in prompts) + sampling.max_new_tokens
    engines = {name: create_rollout_engine(name, RolloutContext(policy, tokenizer, path, max_sequence_tokens=longest))
               for name in names}
    produced = {name: [] for name in names}
    computed = {name: [] for name in names}
    result: dict = {"model": str(path), "prompts_per_rank": len(prompts), "n": sampling.n,
                    "max_new_tokens": sampling.max_new_tokens, "fsdp_version": policy.fsdp_version,
                    "sharded_units": policy.num_sharded_units, "collectives_per_call": {}}
    rounds = iter(range(1 << 30))

    def call(name: str) -> float:
        torch.manual_seed(1000 * (next(rounds) // len(names)) + rank)  # a round's engines: the same seed
        holder = {}
        seconds = timed(lambda: holder.update(out=engines[name].generate(prompts, sampling)), backend.synchronize)
        produced[name].append(int(holder["out"].mask.sum()))
        computed[name].append(int(holder["out"].tokens_computed))
        return seconds

    with policy.eval_mode():
        if "vllm" in engines:
            sync_weights(policy, engines["vllm"])
            pushes = [timed(lambda: sync_weights(policy, engines["vllm"]), backend.synchronize)
                      for _ in range(options["steps"])]
            result["vllm_weight_sync"] = summary(pushes)
        for name in names:
            engines[name].generate(prompts, sampling)  # warm-up
            with CommCounter() as comm:
                engines[name].generate(prompts, sampling)
            result["collectives_per_call"][name] = comm.as_dict()
        with CommCounter() as comm:  # before: every new token paid an all-reduce (synced_gpus) across ranks
            ids = torch.tensor(prompts[:1] * 2)
            policy.generate(input_ids=ids.to(backend.device()), attention_mask=torch.ones_like(ids).to(
                backend.device()), do_sample=False, max_new_tokens=16, min_new_tokens=16,
                pad_token_id=tokenizer.pad_token_id, synced_gpus=True)
        result["collectives_per_call"]["hf_synced_16_tokens"] = comm.as_dict()
        for values in (produced, computed):
            for name in names:
                values[name].clear()
        samples = interleave({name: (lambda name=name: call(name)) for name in names}, options["steps"])
    for name in names:
        result[name] = summary(samples[name])
        result[name].update(tokens_produced_per_call=sum(produced[name]) / len(produced[name]),
                            tokens_computed_per_call=sum(computed[name]) / len(computed[name]))
        result[name]["computed_over_produced"] = (result[name]["tokens_computed_per_call"]
                                                  / result[name]["tokens_produced_per_call"])
        result[name]["response_tokens_per_s"] = (result[name]["tokens_produced_per_call"]
                                                 / (result[name]["median_ms"] / 1e3))
    result["continuous_over_hf"] = ratio(samples["hf-continuous"], samples["hf"])
    if "vllm" in samples:  # call time per response token produced, vllm over hf-continuous (each round)
        result["vllm_over_continuous_per_token"] = ratio(
            [t / max(p, 1) for t, p in zip(samples["vllm"], produced["vllm"], strict=True)],
            [t / max(p, 1) for t, p in zip(samples["hf-continuous"], produced["hf-continuous"], strict=True)])
    return result
