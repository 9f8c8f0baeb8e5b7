"""accel-dpo against TRL's DPOTrainer, or accel-rm against TRL's RewardTrainer (``--trainer dpo|rm``), on the same
work, one process each, runs interleaved (ours, TRL, ours, TRL, ...).

The work: a tiny Qwen2.5-like model directory (``make_tiny_model``: hidden 128, 4 layers, vocabulary 2048, one EOS
id) and 1,024 conversational prompt/chosen/rejected pairs whose lengths vary (prompts of 5..40 words, each
response 1..120 words, drawn apart), every sequence within ``max_length`` 512 (TRL's RewardTrainer drops longer
pairs, ours would cut them: none is longer); 16 pairs per optimizer step, lr 1e-5 constant, gradient clipping at 1.0,
fp32 without activation recomputation on both sides (TRL's defaults, bf16 and gradient checkpointing, set off so
both do the same arithmetic). TRL: 4 padded pairs per micro-batch x 4 accumulation steps (DPO: chosen and rejected
in one padded forward, its reference a frozen copy run on the same batch). Ours: ``train.batch_size=16``, packed
micro-batches of at most 4096 tokens (what 4 padded pairs of 2 x 512 bound), DPO's reference a frozen engine (not
offloaded). Reported: seconds per optimizer step (median of each run, the first step left out), milliseconds per
pair, and ours / TRL per pair (the median over rounds of each round's ratio). TRL runs in its own virtual
environment (``--trl-python``; ``ci/bench-peers.sh`` makes one), never in the project's.

    PEERS_THREADS=1 python ci/peers/preference_compare.py --trainer dpo --trl-python runs/peers/venv/bin/python
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

PAIRS_PER_STEP, PER_DEVICE, MAX_LENGTH, LR = 16, 4, 512, 1e-5
RECIPES = {"dpo": ("engine.offline.objectives.dpo.cli", "trl_dpo.py", "accel-dpo", "TRL DPOTrainer"),
           "rm": ("engine.offline.objectives.rm.cli", "trl_rm.py", "accel-rm", "TRL RewardTrainer")}


def write_work(directory: Path) -> tuple[Path, Path]:
    """The model directory and the pairs file."""
    sys.path.insert(0, str(ROOT))
    from engine.demo_model import _WORDS, make_tiny_model

    model = make_tiny_model(directory / "model", hidden_size=128, layers=4, vocab_size=2048, single_eos=True)
    rng = random.Random(0)

    def words(low: int, high: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))

    rows = [{"prompt": [{"role": "user", "content": words(5, 40)}],
             "chosen": [{"role": "assistant", "content": words(1, 120)}],
             "rejected": [{"role": "assistant", "content": words(1, 120)}]} for _ in range(1024)]
    data = directory / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return model, data


def run_ours(python: str, module: str, model: Path, data: Path, steps: int, out: Path) -> dict:
    overrides = [f"model.path={model}", f"data.path={data}", f"train.steps={steps}",
                 f"train.batch_size={PAIRS_PER_STEP}", f"train.micro_batch_tokens={2 * PER_DEVICE * MAX_LENGTH}",
                 f"data.max_length={MAX_LENGTH}", "data.val_fraction=0", "run.val_every=0", "run.progress=false",
                 f"engine.lr={LR}", "engine.lr_schedule=constant", "engine.warmup_steps=0",
                 f"run.output_dir={out.parent}", f"run.name={out.name}"]
    subprocess.run([python, "-m", module, "--nproc", "1", *overrides], check=True, cwd=ROOT, env=peer_env(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"steps": [row["step_time_s"] for row in rows], "losses": [row["loss"] for row in rows],
            "tokens_per_step": statistics.mean(row["num_tokens"] for row in rows)}


def run_trl(python: str, script: str, model: Path, data: Path, steps: int, out: Path) -> dict:
    subprocess.run([python, str(ROOT / "ci/peers" / script), "--model-dir", str(model), "--data", str(data), "--out",
                    str(out), "--steps", str(steps), "--per-device", str(PER_DEVICE), "--accumulation",
                    str(PAIRS_PER_STEP // PER_DEVICE), "--max-length", str(MAX_LENGTH), "--lr", str(LR)],
                   check=True, cwd=ROOT, env=peer_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> int:
    parser = comparison_parser(__doc__, steps=6)
    parser.add_argument("--trainer", choices=sorted(RECIPES), required=True)
    args = parser.parse_args()
    module, script, ours_name, trl_name = RECIPES[args.trainer]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, data = write_work(work)
        sides = {ours_name: [], trl_name: []}
        for index in range(args.rounds):
            sides[ours_name].append(run_ours(args.python, module, model, data, args.steps, work / f"ours-{index}"))
            sides[trl_name].append(run_trl(args.trl_python, script, model, data, args.steps,
                                           work / f"trl-{index}.json"))
    result = {"trainer": args.trainer, "pairs_per_step": PAIRS_PER_STEP, "max_length": MAX_LENGTH,
              "rounds": args.rounds, "steps": args.steps,
              "tokens_per_step": statistics.mean(run["tokens_per_step"] for run in sides[ours_name]), "sides": {}}
    for name, runs in sides.items():
        medians = [statistics.median(run["steps"][1:]) for run in runs]
        result["sides"][name] = {"step_s_per_run": medians,
                                 "ms_per_pair": [1e3 * m / PAIRS_PER_STEP for m in medians],
                                 "first_losses": [run["losses"][0] for run in runs]}
    ours, theirs = (result["sides"][name]["step_s_per_run"] for name in (ours_name, trl_name))
    result["ours_over_trl_per_pair"] = median_ratio(ours, theirs)
    publish(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
