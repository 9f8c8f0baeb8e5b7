#!/usr/bin/env bash
# The test command: set up the environment, then run the whole suite (extra arguments go to pytest).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/ci/setup.sh"
cd "$root"
exec "${ACCEL_VENV:-$root/.venv}/bin/python" -m pytest "$@"
