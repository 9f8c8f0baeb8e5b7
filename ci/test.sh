#!/usr/bin/env bash
# The test command: set up the environment, run the lint gate, then the whole suite (extra arguments go to pytest).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/ci/lint.sh"
cd "$root"
exec "${ACCEL_VENV:-$root/.venv}/bin/python" -m pytest "$@"
