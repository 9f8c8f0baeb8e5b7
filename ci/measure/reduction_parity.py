"""Every metric of a 2-rank GRPO and SFT run (4 steps each): a reference checkout on the ``cpu`` backend (before
issue 35: float64 reductions) against this checkout on the ``strict`` device (float64 reductions refused), side by
side. Timings are left out; every other value is compared, and the worst relative difference printed.

Usage: git worktree add --detach /tmp/ref c89d1ad && python ci/measure/reduction_parity.py /tmp/ref [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
TIMINGS = ("time", "per_s", "memory", "_s", "mfu", "busy")
GRPO = ["-m", "engine.rl.algorithms.grpo.cli", "train.prompts_per_step=4", "rollout.n=4", "train.prompts_per_update=2",
        "train.micro_batch_size=4", "run.progress=false", "train.steps=4"]


def sft_args(root: Path) -> list[str]:
    from test_sft_run import _conversation

    from engine.demo_model import make_tiny_model

    model, train = root / "model", root / "train.jsonl"
    if not model.exists():
        make_tiny_model(model, vocab_size=512, single_eos=True)
    train.write_text("".join(json.dumps(_conversation(i)) + "\n" for i in range(40)))
    return ["-m", "engine.offline.objectives.sft.cli", f"model.path={model}",
            f"data.path={train}", "train.batch_size=8",
            "train.micro_batch_tokens=128", "data.max_length=128", "run.progress=false", "train.steps=4",
            "engine.lora_rank=4", "engine.lr=1e-2"]


def run(tree: Path, backend: str, args: list[str], out: Path, name: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": f"{tree}:{tree / 'tests'}", "OMP_NUM_THREADS": "1", "ACCEL_BACKEND": backend}
    done = subprocess.run([sys.executable, *args, f"run.output_dir={out}", f"run.name={name}"], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} in {tree} failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reference", type=Path, help="a checkout of the project before the change")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="reduction-parity-"))
    root.mkdir(parents=True, exist_ok=True)
    for name, command in (("grpo", GRPO), ("sft", sft_args(root))):
        want = run(args.reference, "cpu", command, root / "reference", name)
        got = run(ROOT, "strict", command, root / "strict", name)
        worst, count = 0.0, 0
        for a, b in zip(want, got, strict=True):
            for key, value in a.items():
                if any(t in key for t in TIMINGS) or not isinstance(value, (int, float)):
                    continue
                count += 1
                worst = max(worst, abs(b[key] - value) / abs(value) if value else abs(b[key]))
        print(f"{name}: {len(want)} steps, {count} values compared, worst relative difference {worst:.2e}")


if __name__ == "__main__":
    main()
