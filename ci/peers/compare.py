"""accel-grpo against TRL's GRPOTrainer on the same work, one process each, runs interleaved (ours, TRL, ...).

Called by ``ci/bench-peers.sh`` with both interpreters. Prints seconds per GRPO step (median of each run, first
step left out as warm-up), start-up, the ratio ours / TRL per pair of runs, and the reward curves side by side;
writes everything to ``--json``. Settings that could not be matched are listed in ``UNMATCHED``.

Two cases: ``--case toy`` (default), cpu-demo's built-in character model answering in at most 4 tokens; ``--case
long``, a model directory written once by ``accel-grpo make-tiny-model`` (hidden 128, 4 layers, vocabulary 2048,
EOS bias 0.33, one EOS id: TRL stops at the tokenizer's EOS only) whose sampled responses spread over 1..128
tokens, with up to 128 new tokens. Both sides run the echo task's prompts and reward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

UNMATCHED = [
    "sampling: both sample with temperature 1.0, top_p 1.0, no top-k, but from different random streams, so the "
    "rollouts (and reward curves) differ run to run",
    "prompts: accel-grpo draws fresh echo prompts each step from its own seeded generator; TRL reads a dataset "
    "of the same number of prompts drawn once, shuffled by its sampler",
    "old log-probs: with one update per step both skip the no-grad forward for the old policy (they equal the "
    "current ones)",
    "advantages: TRL divides by (std + 1e-4), accel-grpo by its own epsilon; both per group",
    "KL: both k3 with coefficient 0.001 against a frozen copy of the initial model; accel-grpo keeps that copy "
    "offloaded to host memory between uses (cpu-demo's ref_param_offload), which is free on the CPU",
    "step time: accel-grpo's step_time_s covers rollout, scoring, log-probs and update; TRL's is the time between "
    "two on_step_end callbacks, so it also covers TRL's logging",
    "time outside the steps (process start to exit, less the steps, measured alike for both): accel-grpo's "
    "includes saving a final checkpoint and plotting its curves; TRL saves nothing (save_strategy='no')",
    "micro-batches: TRL pads each micro-batch of --micro-batch completions; accel-grpo packs them (one row, no pad "
    "tokens; train.padding_free), --micro-batch sequences or train.micro_batch_tokens per micro-batch",
]
LONG_CASE_MODEL = {"hidden_size": 128, "layers": 4, "vocab_size": 2048, "eos_bias": 0.33, "single_eos": True,
                   # plain sampling on both sides: no top-k or repetition penalty from generation_config.json
                   "generation": {"top_k": 0, "top_p": 1.0, "repetition_penalty": 1.0}}


def long_case_model(python: str, directory: Path) -> Path:
    """The long case's model directory, written once (with our interpreter) and reused by later runs."""
    if not (directory / "config.json").is_file():
        code = ("import sys; from engine.demo_model import make_tiny_model; "
                f"make_tiny_model(sys.argv[1], **{LONG_CASE_MODEL!r})")
        subprocess.run([python, "-c", code, str(directory)], check=True, cwd=ROOT, env=_env())
    return directory


def run_ours(python: str, args, run_dir: Path) -> dict:
    overrides = [f"train.steps={args.steps}", f"train.prompts_per_step={args.prompts_per_step}",
                 f"rollout.n={args.n}", f"train.prompts_per_update={args.prompts_per_step}",
                 f"train.micro_batch_size={args.micro_batch}", f"rollout.max_new_tokens={args.new_tokens}",
                 "run.progress=false", f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
                 *([f"model.path={args.model_dir}"] if args.model_dir else []), *args.ours_override]
    started = time.perf_counter()
    subprocess.run([python, "-m", "engine.rl.algorithms.grpo.cli",
                    "--preset", "cpu-demo", "--nproc", "1", *overrides], check=True,
                   cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step_time_s"] for r in rows]
    return {"steps": steps, "rewards": [r["reward_mean"] for r in rows], "wall_s": wall,
            "outside_steps_s": wall - sum(steps), "response_lengths": [r["response_length"] for r in rows]}


def run_trl(python: str, args, out: Path) -> dict:
    started = time.perf_counter()
    subprocess.run([python, str(ROOT / "ci/peers/trl_grpo.py"), "--out", str(out), "--steps", str(args.steps),
                    "--prompts-per-step", str(args.prompts_per_step), "--n", str(args.n),
                    "--micro-batch", str(args.micro_batch), "--new-tokens", str(args.new_tokens),
                    *(["--model-dir", str(args.model_dir)] if args.model_dir else [])],
                   check=True, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    rows = [r for r in lines if "step" in r]
    start = next(r for r in lines if r.get("event") == "start")
    steps = [r["step_time_s"] for r in rows]
    return {"steps": steps, "rewards": [r["reward_mean"] for r in rows], "wall_s": wall,
            "outside_steps_s": wall - sum(steps), "startup_s": start["startup_s"],
            "response_lengths": [r.get("response_length") for r in rows],
            "dropped_settings": start["dropped_settings"]}


def _env() -> dict:
    threads = os.environ.get("PEERS_THREADS", "2")
    return {**os.environ, "PYTHONPATH": str(ROOT), "ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}


def _mean(values: list) -> str:
    """The mean of the numbers in ``values`` as text (TRL versions that do not log a length give None)."""
    numbers = [v for v in values if v is not None]
    return f"{statistics.mean(numbers):.1f}" if numbers else "n/a"


def _median_after_warmup(steps: list[float]) -> float:
    return statistics.median(steps[1:] if len(steps) > 1 else steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ours-python", required=True)
    parser.add_argument("--trl-python", required=True)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs (ours, TRL), interleaved")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=None, help="default: 4 (toy), 128 (long)")
    parser.add_argument("--case", choices=("toy", "long"), default="toy")
    parser.add_argument("--ours-override", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra accel-grpo override for our side, e.g. train.micro_batch_tokens=2048")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "runs/peers")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.new_tokens is None:
        args.new_tokens = 128 if args.case == "long" else 4
    for name in ("rounds", "steps", "prompts_per_step", "n", "micro_batch", "new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if (args.prompts_per_step * args.n) % args.micro_batch:
        parser.error("--micro-batch must divide prompts-per-step x n (one optimizer update per step)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.model_dir = long_case_model(args.ours_python, args.out_dir / "long-case-model") if args.case == "long" \
        else None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = []
    for index in range(args.rounds):
        ours = run_ours(args.ours_python, args, args.out_dir / f"ours-{stamp}-{index}")
        trl = run_trl(args.trl_python, args, args.out_dir / f"trl-{stamp}-{index}.jsonl")
        pair = {"ours": ours, "trl": trl, "ours_s": _median_after_warmup(ours["steps"]),
                "trl_s": _median_after_warmup(trl["steps"])}
        pair["ours_over_trl"] = pair["ours_s"] / pair["trl_s"]
        runs.append(pair)
        print(f"round {index + 1}: median s/step ours {pair['ours_s']:.3f}, TRL {pair['trl_s']:.3f} "
              f"(ours / TRL {pair['ours_over_trl']:.2f}); outside the steps ours {ours['outside_steps_s']:.1f} s, "
              f"TRL {trl['outside_steps_s']:.1f} s; mean response tokens ours {_mean(ours['response_lengths'])}, "
              f"TRL {_mean(trl['response_lengths'])}", flush=True)
    ratios = [p["ours_over_trl"] for p in runs]
    print(f"\nours / TRL seconds per step: median {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}-{max(ratios):.2f}] over {len(runs)} interleaved pair(s); one process each, "
          f"{os.environ.get('PEERS_THREADS', '2')} threads, {args.case} case, {args.prompts_per_step}x{args.n} "
          f"completions of up to {args.new_tokens} tokens and one optimizer update per step")
    print("\nreward mean (average over runs)\n step   ours    TRL")
    for step in range(0, args.steps, max(1, args.steps // 10)):
        ours = statistics.mean(p["ours"]["rewards"][step] for p in runs if step < len(p["ours"]["rewards"]))
        trl = statistics.mean(p["trl"]["rewards"][step] for p in runs if step < len(p["trl"]["rewards"]))
        print(f"{step + 1:5d} {ours:6.3f} {trl:6.3f}")
    dropped = sorted({s for p in runs for s in p["trl"]["dropped_settings"]})
    print("\nnot matched:\n- " + "\n- ".join(UNMATCHED + [f"TRL has no setting {s}" for s in dropped]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": runs, "unmatched": UNMATCHED, "trl_dropped_settings": dropped,
                                         "settings": vars(args) | {"out_dir": str(args.out_dir),
                                                                   "json": str(args.json),
                                                                   "model_dir": str(args.model_dir)}}, indent=2))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
