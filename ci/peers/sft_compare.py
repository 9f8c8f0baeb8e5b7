"""accel-sft against TRL's SFTTrainer on the same work, one process each, runs interleaved (ours, TRL default, TRL
packing, ours, ...).

The work: a tiny Qwen2.5-like model directory (``make_tiny_model``: hidden 128, 4 layers, vocabulary 2048) and
conversational prompt-completion rows whose lengths vary (prompts of 5..40 words, completions of 1..150), the
completion trained; 16 sequences per optimizer step, up to 512 tokens each. TRL default: 4 padded sequences per
micro-batch x 4 accumulation steps. TRL packing: rows of 512 tokens (its ``bfd`` packing), as many rows per step as
hold the same tokens. Both sides compute in fp32 without activation recomputation (TRL's defaults are bf16 and
gradient checkpointing: set off, so both do the same arithmetic). accel-sft: ``train.batch_size=16``, packed micro-
batches of at most 2048 tokens (what 4 padded rows of 512 bound). Reported: seconds per optimizer step (median of
each run, the first step left out) and supervised tokens per second (the rows' average supervised tokens x sequences
per step / step time, the same count for every side). TRL runs with ``PYTHONPATH`` pointing at a directory holding
TRL and datasets (``--trl-site``), never installed into the project's environment, e.g. ``pip install --no-deps
--target /tmp/trl-site trl==1.16.0 datasets dill xxhash multiprocess pandas`` (the rest, torch and transformers
included, are the project's own).

    python ci/peers/sft_compare.py --trl-site /tmp/trl-site --rounds 2 --steps 8
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from peer_common import ROOT, comparison_parser, median_ratio, peer_env, publish

SEQUENCES_PER_STEP, MAX_LENGTH, MICRO_TOKENS = 16, 512, 2048


def write_work(directory: Path) -> tuple[Path, Path, float, float]:
    """The model directory, the data file, and the rows' mean tokens and mean supervised tokens (as accel-sft
    counts them)."""
    sys.path.insert(0, str(ROOT))
    from engine.demo_model import _WORDS, make_tiny_model
    from engine.offline.masks import tokenize_example
    from engine.offline.messages import Example
    from engine.offline.model_files import load_tokenizer

    model = make_tiny_model(directory / "model", hidden_size=128, layers=4, vocab_size=2048, single_eos=True)
    rng = random.Random(0)
    rows = []
    for _ in range(1024):
        prompt = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 40)))
        completion = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 150)))
        rows.append({"prompt": [{"role": "user", "content": prompt}],
                     "completion": [{"role": "assistant", "content": completion}]})
    data = directory / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tokenizer = load_tokenizer(str(model))
    items = [tokenize_example(Example("x", prompt=r["prompt"], completion=r["completion"]), tokenizer, "completion")
             for r in rows]
    return model, data, statistics.mean(len(i.ids) for i in items), statistics.mean(i.supervised for i in items)


def run_ours(python: str, model: Path, data: Path, steps: int, out: Path) -> list[float]:
    overrides = [f"model.path={model}", f"data.path={data}", f"train.steps={steps}",
                 f"train.batch_size={SEQUENCES_PER_STEP}", f"train.micro_batch_tokens={MICRO_TOKENS}",
                 f"data.max_length={MAX_LENGTH}", "data.val_fraction=0", "run.val_every=0", "run.progress=false",
                 "engine.lr=1e-4", "engine.lr_schedule=constant", "engine.warmup_steps=0",
                 f"run.output_dir={out.parent}", f"run.name={out.name}"]
    subprocess.run([python, "-m", "engine.offline.objectives.sft.cli", "--nproc", "1", *overrides], check=True,
                   cwd=ROOT, env=peer_env(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row["step_time_s"] for row in rows]


def run_trl(python: str, site: str, model: Path, data: Path, steps: int, out: Path, packing: bool,
            mean_length: float) -> list[float]:
    args = ["--model-dir", str(model), "--data", str(data), "--out", str(out), "--steps", str(steps),
            "--max-length", str(MAX_LENGTH)]
    if packing:  # rows of MAX_LENGTH tokens holding the tokens of SEQUENCES_PER_STEP sequences
        rows = max(1, round(SEQUENCES_PER_STEP * mean_length / MAX_LENGTH))
        args += ["--packing", "--per-device", "1", "--accumulation", str(rows)]
    subprocess.run([python, str(ROOT / "ci/peers/trl_sft.py"), *args], check=True, cwd=ROOT,
                   env=peer_env({"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())["steps"]


def main() -> int:
    parser = comparison_parser(__doc__, steps=12,
                               peer=("--trl-site", "a directory holding trl and datasets (PYTHONPATH)"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, data, mean_length, supervised = write_work(work)
        sides = {"accel-sft": [], "trl-default": [], "trl-packing": []}
        for round_index in range(args.rounds):
            sides["accel-sft"].append(run_ours(args.python, model, data, args.steps, work / f"ours-{round_index}"))
            sides["trl-default"].append(run_trl(args.python, args.trl_site, model, data, args.steps,
                                                work / f"trl-{round_index}.json", False, mean_length))
            sides["trl-packing"].append(run_trl(args.python, args.trl_site, model, data, args.steps,
                                                work / f"trl-pack-{round_index}.json", True, mean_length))
    per_step_tokens = supervised * SEQUENCES_PER_STEP
    result = {"sequences_per_step": SEQUENCES_PER_STEP, "mean_tokens_per_sequence": mean_length,
              "mean_supervised_tokens_per_sequence": supervised, "rounds": args.rounds, "steps": args.steps,
              "sides": {}}
    for name, runs in sides.items():
        medians = [statistics.median(steps[1:]) for steps in runs]
        result["sides"][name] = {"step_s_per_run": medians,
                                 "supervised_tokens_per_s": per_step_tokens / statistics.median(medians)}
    ours = result["sides"]["accel-sft"]["step_s_per_run"]
    for name in ("trl-default", "trl-packing"):
        theirs = result["sides"][name]["step_s_per_run"]
        result[f"ours_over_{name}_time"] = median_ratio(ours, theirs)
    publish(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
