#!/usr/bin/env bash
# A short run of every accel-bench scenario (about 2 minutes on 2 cores): mode switch, gradient accumulation,
# engine vs a hand-written FSDP2 loop, rollout, GRPO step. Writes runs/bench/bench.json and bench.png. Extra
# arguments go to accel-bench (e.g. --nproc 1 --hidden 896 ... on a GPU machine). With BENCH_PYTHON set (e.g.
# python3 on a machine that cannot install anything, PYTHONPATH=.) it runs that interpreter and skips the set-up.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ -z "${BENCH_PYTHON:-}" ]; then
  bash "$root/ci/setup.sh"
  BENCH_PYTHON=${ACCEL_VENV:-$root/.venv}/bin/python
fi
out=${BENCH_OUT:-$root/runs/bench}
mkdir -p "$out"
exec "$BENCH_PYTHON" -m engine.bench --steps 5 --switches 5 --micro-batch-counts 1,2,4,8 --rollout-tokens 8,32 \
    --grpo-steps 3 --json "$out/bench.json" --plot "$out/bench.png" "$@"
