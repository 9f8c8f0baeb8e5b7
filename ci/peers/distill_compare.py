"""accel-distill against TRL's on-policy distillation trainer (``trl.DistillationTrainer``, reverse KL) on the same
work, one process each, runs interleaved (ours, TRL, ours, TRL...).

The work: a student and a teacher sharing one tokenizer (``make_tiny_model``: byte-level BPE of 2048 tokens, one
EOS id; student hidden 64 x 2 layers, teacher hidden 128 x 4, random weights: timing only) and 512 conversational
prompts of 5..40 words; 64 sequences per optimizer step (one response per prompt, as TRL samples), up to 64 new
tokens at temperature 1. TRL: 16 sequences per micro-batch x 4 accumulation steps, fp32, no recomputation, its
default generation (transformers ``generate``). accel-distill: ``train.prompts_per_step=64 rollout.n=1``, micro-
batches of 16 sequences, its default rollout engine (hf-continuous; ``--ours-engine hf`` for transformers'
``generate`` as TRL). Reported: seconds per optimizer step (median of each run, its first step left out), response
tokens per step (each side's own mean length: the two students sample differently), seconds per response token and
ours / TRL per token (median over rounds). TRL runs in its own virtual environment (``--trl-python``; ``ci/bench-
peers.sh`` makes one), never in the project's.

    python ci/peers/distill_compare.py --trl-python runs/peers/venv/bin/python --rounds 2 --steps 6
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from peer_common import ROOT, comparison_parser, median_ratio, peer_env, publish

SEQUENCES, MICRO, NEW_TOKENS = 64, 16, 64


def write_work(directory: Path) -> tuple[Path, Path, Path]:
    sys.path.insert(0, str(ROOT))
    from engine.demo_model import _WORDS, make_tiny_model

    student = make_tiny_model(directory / "student", hidden_size=64, layers=2, single_eos=True, eos_bias=0.2)
    teacher = make_tiny_model(directory / "teacher", hidden_size=128, layers=4, single_eos=True, seed=1)
    rng = random.Random(0)
    rows = [{"prompt": [{"role": "user", "content": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 40)))}]}
            for _ in range(512)]
    data = directory / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return student, teacher, data


def run_ours(python: str, student: Path, teacher: Path, data: Path, steps: int, out: Path, engine: str) -> dict:
    overrides = [f"model.path={student}", f"teacher.path={teacher}", f"data.path={data}", f"train.steps={steps}",
                 f"train.prompts_per_step={SEQUENCES}", "rollout.n=1", f"rollout.max_new_tokens={NEW_TOKENS}",
                 f"train.micro_batch_size={MICRO}", f"rollout.engine={engine}", "teacher.param_offload=false",
                 "engine.lr=1e-4", "run.progress=false", "run.log_samples=0", f"run.output_dir={out.parent}",
                 f"run.name={out.name}"]
    subprocess.run([python, "-m", "engine.rl.algorithms.distill.cli", "--nproc", "1", *overrides], check=True, cwd=ROOT,
                   env=peer_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"steps": [r["step_time_s"] for r in rows], "response_lengths": [r["response_length"] for r in rows]}


def run_trl(python: str, student: Path, teacher: Path, data: Path, steps: int, out: Path) -> dict:
    subprocess.run([python, str(ROOT / "ci/peers/trl_distill.py"), "--student", str(student), "--teacher",
                    str(teacher), "--data", str(data), "--out", str(out), "--steps", str(steps), "--per-device",
                    str(MICRO), "--accumulation", str(SEQUENCES // MICRO), "--new-tokens", str(NEW_TOKENS)],
                   check=True, cwd=ROOT, env=peer_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def per_token(run: dict) -> float:
    """Seconds per response token of a run: its median step (the first left out) over its mean tokens per step."""
    return statistics.median(run["steps"][1:]) / (statistics.mean(run["response_lengths"][1:]) * SEQUENCES)


def main() -> int:
    parser = comparison_parser(__doc__, steps=6)
    parser.add_argument("--ours-engine", default="hf-continuous", help="accel-distill's rollout.engine")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        student, teacher, data = write_work(work)
        sides = {"accel-distill": [], "trl": []}
        for index in range(args.rounds):
            sides["accel-distill"].append(run_ours(args.python, student, teacher, data, args.steps,
                                                   work / f"ours-{index}", args.ours_engine))
            sides["trl"].append(run_trl(args.trl_python, student, teacher, data, args.steps,
                                        work / f"trl-{index}.json"))
    result = {"sequences_per_step": SEQUENCES, "max_new_tokens": NEW_TOKENS, "ours_engine": args.ours_engine,
              "rounds": args.rounds, "steps": args.steps, "sides": {}}
    for name, runs in sides.items():
        result["sides"][name] = {"step_s_per_run": [statistics.median(r["steps"][1:]) for r in runs],
                                 "response_tokens_per_step": [statistics.mean(r["response_lengths"][1:]) * SEQUENCES
                                                              for r in runs],
                                 "ms_per_response_token": [per_token(r) * 1e3 for r in runs]}
    ours, theirs = (result["sides"][n]["ms_per_response_token"] for n in ("accel-distill", "trl"))
    result["ours_over_trl_per_token"] = median_ratio(ours, theirs)
    publish(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
