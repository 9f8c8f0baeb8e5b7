#!/usr/bin/env bash
# The SFT demo: set up the environment, then run accel-sft's CPU demo (2 processes on the CPU backend: a tiny
# Qwen2.5-like model learns a synthetic chat task in about a minute). Extra arguments go to accel-sft.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/ci/setup.sh"
cd "$root"
exec "${ACCEL_VENV:-$root/.venv}/bin/accel-sft" "$@"
