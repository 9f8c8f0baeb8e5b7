#!/usr/bin/env bash
# Regenerate the demo figures the README and docs/grpo.md / docs/sft.md quote: run both CPU demos as a new user
# would (no arguments) and print each one's last line with the date, the machine's cores and its load.
#   bash ci/demo-figures.sh            # about 3 minutes on 2 cores
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${ACCEL_PYTHON:-${ACCEL_VENV:-$root/.venv}/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$root"
echo "measured $(date -u +%Y-%m-%d) on $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for trainer in grpo sft; do
  PYTHONPATH="$root" "$python" -m "engine.$trainer.cli" run.progress=false "run.output_dir=$out" 2>/dev/null \
    | grep "done in"
done
