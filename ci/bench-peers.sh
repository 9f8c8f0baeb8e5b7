#!/usr/bin/env bash
# accel-grpo against TRL's GRPOTrainer on the same work (same model, task, reward, batch geometry), one process
# each, runs interleaved: cpu-demo's 4-token toy (default), or --case long (a make-tiny-model directory whose
# responses spread over 1..128 tokens, 16 prompts x 8, up to 128 new tokens). TRL goes into its own virtual
# environment (runs/peers/venv, or $PEERS_VENV), never into the project's. Extra arguments go to
# ci/peers/compare.py (e.g. --case long --rounds 3 --steps 10).
# Environment: PEERS_THREADS (default 2) torch threads per process.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/ci/setup.sh"
ours=${ACCEL_VENV:-$root/.venv}/bin/python
peers=${PEERS_VENV:-$root/runs/peers/venv}
trl_version=1.16.0

if [ ! -x "$peers/bin/python" ]; then
  echo "ci/bench-peers.sh: creating $peers for TRL $trl_version" >&2
  python3 -m venv "$peers"
fi
if ! "$peers/bin/python" -c "import trl, sys; sys.exit(trl.__version__ != '$trl_version')" 2>/dev/null; then
  echo "ci/bench-peers.sh: installing TRL $trl_version into $peers (torch pinned to the same CPU build)" >&2
  # torch==2.13.0 in the same command keeps pip on the CPU build; pluggy and PyYAML let the TRL script import
  # this repository's task, reward and model definitions.
  "$peers/bin/python" -m pip install --quiet --disable-pip-version-check -c "$root/ci/constraints.txt" \
      torch==2.13.0 "trl==$trl_version" pluggy PyYAML
fi
cd "$root"
exec "$ours" ci/peers/compare.py --ours-python "$ours" --trl-python "$peers/bin/python" \
    --json "$root/runs/peers/compare.json" "$@"
