#!/usr/bin/env bash
# The lint gate: ruff (pyflakes, pycodestyle at 120 columns, import order, bugbear; pyproject.toml [tool.ruff])
# must report nothing. Seconds; run by .ci/run and by ci/test.sh before the tests. `ruff check --fix .` mends most.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/ci/setup.sh"
cd "$root"
"${ACCEL_VENV:-$root/.venv}/bin/ruff" check .
