#!/usr/bin/env bash
# The second CI leg: the engine and backend tests on another torch, in its own virtual environment.
#
#   bash ci/test-torch.sh 2.10.0 [pytest options, e.g. -k faults -x]
#
# The environment is .venv-torch<VERSION> (or $ACCEL_VENV); it is reinstalled only when pyproject.toml or the
# constraints changed. Older torch exists on the registry only as the CUDA build (torch plus its CUDA libraries,
# about 3.5 GB); it imports and runs on a CPU-only machine. The wheels are downloaded once into a wheelhouse
# ($ACCEL_WHEELS, default ~/.cache/accel-backends/wheels-torch<VERSION>; keep it in CI's cache) and installed from
# there without the network afterwards: pip's own HTTP cache was seen not to keep them. --no-compile: Python
# compiles only the modules the tests import, not all of torch's.
# It runs the engine and backend tests (not GRPO, not the packaged plugins), pinned like the main leg
# (ci/constraints.txt) except for torch and setuptools (torch 2.12 requires setuptools<82; the main leg pins 84).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${1:?usage: ci/test-torch.sh TORCH_VERSION [pytest options]}
shift
venv=${ACCEL_VENV:-$root/.venv-torch$version}
wheels=${ACCEL_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/accel-backends/wheels-torch$version}
python=${PYTHON:-python3}
stamp=$venv/.accel-setup-stamp
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
{ grep -v -E '^(torch|setuptools)[=<>!~ ]' "$root/ci/constraints.txt"; echo "torch==$version"; } > "$constraints"
want=$(cat "$root/pyproject.toml" "$constraints" | sha256sum | cut -d' ' -f1)

if [ ! -x "$venv/bin/python" ]; then
  echo "ci/test-torch.sh: creating $venv" >&2
  "$python" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "ci/test-torch.sh: installing torch $version and the test dependencies into $venv" >&2
  start=$SECONDS
  pip=("$venv/bin/python" -m pip --disable-pip-version-check)
  offline=(install --quiet --no-compile --no-index --find-links "$wheels" -c "$constraints" -e "$root[test]")
  if ! "${pip[@]}" "${offline[@]}" 2>/dev/null; then
    echo "ci/test-torch.sh: downloading the wheels into $wheels (first time: about 3.5 GB)" >&2
    "${pip[@]}" download --quiet --dest "$wheels" -c "$constraints" "$root[test]"
    "${pip[@]}" "${offline[@]}"
  fi
  echo "ci/test-torch.sh: installed in $((SECONDS - start)) s" >&2
  echo "$want" > "$stamp"
fi
installed=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
if [ "$installed" != "$version" ]; then
  echo "ci/test-torch.sh: $venv has torch $installed, not $version" >&2
  exit 1
fi
cd "$root"
start=$SECONDS
status=0
ACCEL_EXPECT_TORCH=$version "$venv/bin/python" -m pytest "$@" tests/test_engine_*.py tests/test_*backend*.py tests/test_conformance.py \
    tests/test_registry.py tests/test_torch_range.py tests/test_launch_in_process.py tests/test_grpo_logprobs.py || status=$?
echo "ci/test-torch.sh: torch $version tests took $((SECONDS - start)) s (exit $status)" >&2
exit $status
