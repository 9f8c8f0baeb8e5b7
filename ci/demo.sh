#!/usr/bin/env bash
# The main job: set up the environment, then run the GRPO CPU demo (2 processes on the CPU backend). Extra
# arguments go to accel-grpo (e.g. train.steps=50, or --preset h100 model.path=... on a GPU machine).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/ci/setup.sh"
cd "$root"
exec "${ACCEL_VENV:-$root/.venv}/bin/accel-grpo" "$@"
