#!/usr/bin/env bash
# The main job: set up the environment, then show the device backends usable on this machine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/ci/setup.sh"
exec "${ACCEL_VENV:-$root/.venv}/bin/accel-backends" list "$@"
