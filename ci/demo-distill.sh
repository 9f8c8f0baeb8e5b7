#!/usr/bin/env bash
# The distillation demo and its figures: accel-distill's CPU demo (a student of the built-in character model learns
# the echo task from a teacher twice its width that accel-sft trains once), GRPO alone on the same steps, prompts,
# samples and learning rate, and the teacher's own reward (the teacher distilled into itself: nothing changes), one
# after the other on the CPU backend. Prints the last 10 steps' reward mean of each; the runs stay under
# runs/distill-demo (DEMO_OUT). Extra arguments go to both students' runs (e.g. train.steps=100).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/ci/setup.sh"
cd "$root"
bin=${ACCEL_VENV:-$root/.venv}/bin
out=${DEMO_OUT:-$root/runs/distill-demo}
export ACCEL_BACKEND=cpu
common=(run.output_dir="$out" run.progress=false)
"$bin/accel-distill" --preset cpu-demo "${common[@]}" run.name=distill "$@"
teacher=$("$bin/python" -c "import json,sys; print(json.load(open(sys.argv[1]))['teacher']['path'])" \
          "$out/distill/config.json")
steps=$("$bin/python" -c "import json,sys; print(json.load(open(sys.argv[1]))['train']['steps'])" \
        "$out/distill/config.json")
"$bin/accel-grpo" --preset cpu-demo "${common[@]}" run.name=grpo train.steps="$steps" engine.lr=5e-3 "$@"
"$bin/accel-distill" --preset cpu-demo "${common[@]}" run.name=teacher model.path="$teacher" \
    teacher.path="$teacher" "$@" train.steps=10
"$bin/python" - "$out" <<'PY'
import json, sys
from pathlib import Path

for name in ("teacher", "distill", "grpo"):
    rows = [json.loads(line) for line in (Path(sys.argv[1]) / name / "metrics.jsonl").read_text().splitlines()]
    last = rows[-10:]
    print(f"{name:8s} reward mean over the last {len(last)} of {len(rows)} steps: "
          f"{sum(r['reward_mean'] for r in last) / len(last):.3f}")
PY
