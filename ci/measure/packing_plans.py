"""The packing planner on a real rollout's lengths: micro-batches per rank, token imbalance and pad share of each
plan, for 1, 2 and 8 ranks (pure planning: no forward runs, the ranks are only counted).

The lengths come from one rollout of the long-response case (accel-bench --grpo-case long: a make-tiny-model
directory with --hidden-size 128 --layers 4 --vocab-size 2048 --eos-bias 0.33 --single-eos; 16 echo prompts x 8
responses of up to 128 new tokens), sampled in one process.

Usage: python ci/measure/packing_plans.py [--model-dir DIR]   (default: write the model to a temporary directory)
"""
import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def rollout_lengths(model_dir: Path) -> tuple[list[int], list[int]]:
    """(prompt + response lengths, prompt lengths) of one rollout of the long case, in rollout order."""
    from engine.bench.cli import LONG_CASE_WORK
    from engine.rl.algorithms.grpo.config import build_config
    from engine.train.registry import get_recipe

    config = build_config(None, None, [*LONG_CASE_WORK, f"model.path={model_dir}", "run.progress=false",
                                       "algorithm.kl_coef=0"])
    with tempfile.TemporaryDirectory() as run_dir:
        data, _ = get_recipe("grpo").trainer_of(config, Path(run_dir), resume=False).collect(step=0)
    return data.sequences.lengths.tolist(), data.sequences.starts.tolist()


def rollout_order(lengths: list[int], prompts: list[int], world_size: int) -> tuple[float, float]:
    """Before packing: each rank's own rows padded to its longest prompt + longest response. (imbalance of the
    tokens computed, pad share)."""
    per_rank = len(lengths) // world_size
    computed = []
    for rank in range(world_size):
        mine = range(rank * per_rank, (rank + 1) * per_rank)
        width = max(prompts[i] for i in mine) + max(lengths[i] - prompts[i] for i in mine)
        computed.append(width * per_rank)
    return max(computed) / (sum(computed) / world_size), 1 - sum(lengths) / sum(computed)


def main() -> None:
    from engine.packing import plan_micro_batches

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model_dir
        if model_dir is None:
            from engine.bench.cli import LONG_CASE_MODEL
            from engine.demo_model import make_tiny_model

            model_dir = make_tiny_model(Path(scratch) / "long-case", **LONG_CASE_MODEL)
        lengths, prompts = rollout_lengths(model_dir)
    total = sum(lengths)
    print(f"{len(lengths)} sequences, {total} tokens, {min(lengths)}-{max(lengths)} tokens each")
    print("| plan | ranks | micro-batches per rank | imbalance | pad share |")
    print("|---|---|---|---|---|")
    for label, limits, padded in (("packed, 1,024-token budget", {"max_tokens": 1024}, False),
                                  ("padded, 1,024-token budget", {"max_tokens": 1024}, True),
                                  ("packed, 16 sequences", {"max_sequences": 16}, False),
                                  ("padded, 16 sequences", {"max_sequences": 16}, True)):
        for world_size in (1, 2, 8):
            plan = plan_micro_batches(lengths, world_size, padded=padded, **limits)
            print(f"| {label} | {world_size} | {plan.micro_batches} | {plan.imbalance:.3f} | "
                  f"{1 - total / sum(plan.loads):.1%} |")
    for world_size in (1, 2, 8):
        imbalance, share = rollout_order(lengths, prompts, world_size)
        print(f"| before packing: 16 rows in rollout order, rank-wide width | {world_size} | "
              f"{-(-len(lengths) // (16 * world_size))} | {imbalance:.3f} | {share:.1%} |")


if __name__ == "__main__":
    main()
