"""The cost of the multi-turn loop: rollout time of a 2-turn tool task against a single-turn one of the same
token count, side by side in one process, alternating (1 rank, the CPU, ``hf-continuous``'s decode loop).

    OMP_NUM_THREADS=1 python tests/scripts/agent_loop_cost.py --hidden 64 --layers 2 --prompts 8 --n 4

Each trajectory decodes with the real model (``hf-continuous``'s loop, EOS ignored so that every turn decodes
exactly its tokens) while its token ids are scripted, so both tasks compute the same: a 2-turn trajectory is a
calculator call (the model's tokens), its result (tool and template tokens, appended), then an answer; the
single-turn one is one answer as long as the three together. Compared: the plain single-turn rollout
(``rollout.py``), the multi-turn loop with a trajectory that makes no call (1 turn) and with one call (2 turns).
The 2-turn cost over the single turn is the second engine call (its prefill: no KV cache is kept between turns),
the tool call and the template rendering. Prints one JSON line: median times of --repeats rounds (each variant
first in turn) and the medians of the rounds' ratios, wall and CPU time.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the tools and the scripted turns


def _rank(rank, args, tmp):
    import dataclasses

    import agent_script_plugin
    import agent_tools
    import torch
    from grpo_data import write_jsonl

    from engine.demo_model import make_tiny_model
    from engine.rl.algorithms.grpo.config import build_config
    from engine.rollout.engines import Responses, RolloutContext
    from engine.rollout.engines.hf_continuous import ContinuousRolloutEngine
    from engine.rollout.single_turn import rollout
    from engine.train.registry import get_recipe

    model_dir = make_tiny_model(Path(tmp) / "model", hidden_size=args.hidden, layers=args.layers)
    data = write_jsonl(Path(tmp) / "arith.jsonl", agent_tools.arithmetic_rows(64))
    config = build_config(None, None, [f"model.path={model_dir}", f"data.path={data}", "run.progress=false",
                                       "rollout.tools=[agent_tools:calculator]", f"rollout.n={args.n}",
                                       f"train.prompts_per_step={args.prompts}", "rollout.max_new_tokens=400",
                                       "data.reward=agent_tools:correct_answer", "algorithm.kl_loss_coef=0"])
    trainer = get_recipe("grpo").trainer_of(config, Path(tmp) / "run", resume=False)
    tokenizer, end = trainer.tokenizer, trainer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    filler = tokenizer(" apples", add_special_tokens=False)["input_ids"]

    class Timed(ContinuousRolloutEngine):
        """Decodes with the real model for exactly the scripted turn's length; returns the scripted ids."""

        single_length = None  # set: every turn is one answer of this many tokens (no call)

        def generate(self, prompts, sampling):
            rows = []
            for prompt in prompts:
                text = tokenizer.decode(prompt, skip_special_tokens=False)
                for _ in range(sampling.n):
                    if self.single_length:
                        rows.append(filler * (self.single_length - 1) + [end])
                    else:
                        turn = agent_script_plugin.scripted_turn(text, 0.0, "calculator")
                        rows.append(tokenizer(turn, add_special_tokens=False)["input_ids"] + [end])
            width = max(len(r) for r in rows)
            decoded = super().generate(prompts, dataclasses.replace(sampling, max_new_tokens=width,
                                                                    eos_token_ids=(len(tokenizer) + 1,)))
            ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for index, row in enumerate(rows):
                ids[index, :len(row)], mask[index, :len(row)] = torch.tensor(row), 1
            return Responses(ids, mask, decoded.tokens_computed)

    engine = Timed(RolloutContext(trainer.actor, tokenizer, str(model_dir), config.rollout))
    engine.name = "timed"
    samples = trainer.task.sample(args.prompts, torch.Generator().manual_seed(0))
    sampling = trainer.sampling
    with trainer.actor.eval_mode():
        two = trainer.sampler(engine, samples, sampling)  # the 2-turn lengths, and a warm-up
    length = int(two.attention_mask[:, two.prompt_length:].sum(1).max())
    assert two.trajectories.turns.min() == 2, two.trajectories.turns
    prompts = [tokenizer.decode(trainer.sampler.start(s).prompt, skip_special_tokens=False) for s in samples]
    times = {"single_turn_plain": [], "single_turn_loop": [], "two_turn_loop": []}
    cpu = {name: [] for name in times}  # CPU seconds of the process: less sensitive to a shared machine
    order = list(times)
    for repeat in range(args.repeats):
        for name in order[repeat % 3:] + order[:repeat % 3]:  # each variant first in turn
            engine.single_length = None if name == "two_turn_loop" else length
            started, started_cpu = time.perf_counter(), time.process_time()
            with trainer.actor.eval_mode():
                if name == "single_turn_plain":
                    batch = rollout(engine, tokenizer, prompts, sampling)
                else:
                    batch = trainer.sampler(engine, samples, sampling)
            times[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - started_cpu)
            assert int(batch.attention_mask[:, batch.prompt_length:].sum(1).max()) == length
    medians = {name: statistics.median(values) for name, values in times.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}

    def ratio(samples, top, bottom):  # the median of each round's ratio: both sides saw the same load
        return statistics.median(a / b for a, b in zip(samples[top], samples[bottom], strict=True))

    return {"hidden": args.hidden, "layers": args.layers, "trajectories": len(two), "response_tokens": length,
            "tool_tokens_per_trajectory": float(two.trajectories.tool_tokens.float().mean()),
            "prompt_tokens": len(trainer.sampler.start(samples[0]).prompt), "seconds": medians,
            "two_turn_over_single_turn": ratio(times, "two_turn_loop", "single_turn_plain"),
            "loop_single_over_plain": ratio(times, "single_turn_loop", "single_turn_plain"),
            "cpu_seconds": cpu_medians,
            "cpu_two_turn_over_single_turn": ratio(cpu, "two_turn_loop", "single_turn_plain"),
            "cpu_loop_single_over_plain": ratio(cpu, "single_turn_loop", "single_turn_plain")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    import tempfile

    from distributed import run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        (result,) = run_ranks(_rank, args, tmp, world_size=1, timeout=1800)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
