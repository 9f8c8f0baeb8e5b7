#!/usr/bin/env bash
# Create or refresh the project's virtual environment (.venv, or $ACCEL_VENV) with everything the demo and the
# tests need. Safe to run again: it reinstalls only when pyproject.toml or the constraints changed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${ACCEL_VENV:-$root/.venv}
python=${PYTHON:-python3}
stamp=$venv/.accel-setup-stamp
want=$(cat "$root/pyproject.toml" "$root/ci/constraints.txt" | sha256sum | cut -d' ' -f1)

if [ ! -x "$venv/bin/python" ]; then
  echo "ci/setup.sh: creating $venv" >&2
  "$python" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "ci/setup.sh: installing into $venv (torch CPU build, transformers, peft, pluggy, pytest)" >&2
  # One command, pinned by the constraints file: torch==2.13.0 keeps pip on the CPU build.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      -c "$root/ci/constraints.txt" -e "$root[test]"
  echo "$want" > "$stamp"
fi
