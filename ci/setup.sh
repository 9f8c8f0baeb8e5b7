#!/usr/bin/env bash
# Create or refresh the project's virtual environment (.venv, or $ACCEL_VENV) with everything the demo and the
# tests need. Safe to run again: it reinstalls only when pyproject.toml or the constraints changed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ACCEL_SCRIPT=ci/setup.sh
source "$root/ci/venv-lib.sh"
venv=${ACCEL_VENV:-$root/.venv}

install_cpu_torch_and_tests() {
  echo "ci/setup.sh: installing into $venv (torch CPU build, transformers, peft, pluggy, pytest)" >&2
  accel_need_disk "$venv" 3 "the environment (about 1.5 GiB installed)"
  # One command, pinned by the constraints file: torch==2.13.0 keeps pip on the CPU build.
  "$@" install --quiet --no-cache-dir -c "$root/ci/constraints.txt" -e "$root[test]"
}

accel_ensure_venv "$venv" "$root/ci/constraints.txt" install_cpu_torch_and_tests
