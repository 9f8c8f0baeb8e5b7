#!/usr/bin/env bash
# The second CI leg: the engine and backend tests on another torch, in its own virtual environment.
#
#   bash ci/test-torch.sh 2.10.0 [pytest arguments]
#
# The environment is .venv-torch<VERSION> (or $ACCEL_VENV); it is reinstalled only when pyproject.toml or the
# constraints changed. Older torch exists on the registry only as the CUDA build (torch plus its CUDA libraries,
# about 3.5 GB); it imports and runs on a CPU-only machine. The wheels are downloaded once into a wheelhouse
# ($ACCEL_WHEELS, default ~/.cache/accel-backends/wheels-torch<VERSION>; keep it in CI's cache) and installed from
# there without the network afterwards: pip's own HTTP cache was seen not to keep them.
# Unless pytest arguments name tests, it runs the engine and backend tests (not GRPO, not the packaged plugins).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${1:?usage: ci/test-torch.sh TORCH_VERSION [pytest arguments]}
shift
venv=${ACCEL_VENV:-$root/.venv-torch$version}
wheels=${ACCEL_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/accel-backends/wheels-torch$version}
python=${PYTHON:-python3}
stamp=$venv/.accel-setup-stamp
# Pins: the main leg's, with torch replaced and this torch's own pins (ci/constraints-torch<VERSION>.txt, if any)
# taking precedence.
extra=$root/ci/constraints-torch$version.txt
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
{
  [ -f "$extra" ] && grep -v '^\s*#' "$extra"
  names=$( { [ -f "$extra" ] && grep -v '^\s*#' "$extra" | sed -E 's/[=<>!~ ].*//'; echo torch; } | sort -u)
  grep -v '^\s*#' "$root/ci/constraints.txt" | grep -v -i -x -E "($(echo $names | tr ' ' '|'))[=<>!~ ].*"
  echo "torch==$version"
} | sort -u > "$constraints"
want=$(cat "$root/pyproject.toml" "$constraints" | sha256sum | cut -d' ' -f1)

if [ ! -x "$venv/bin/python" ]; then
  echo "ci/test-torch.sh: creating $venv" >&2
  "$python" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "ci/test-torch.sh: installing torch $version and the test dependencies into $venv" >&2
  start=$SECONDS
  pip=("$venv/bin/python" -m pip --disable-pip-version-check)
  if ! "${pip[@]}" install --quiet --no-index --find-links "$wheels" -c "$constraints" -e "$root[test]" 2>/dev/null
  then
    echo "ci/test-torch.sh: downloading the wheels into $wheels (first time: about 3.5 GB)" >&2
    "${pip[@]}" download --quiet --dest "$wheels" -c "$constraints" "$root[test]"
    "${pip[@]}" install --quiet --no-index --find-links "$wheels" -c "$constraints" -e "$root[test]"
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
names_tests=false
for arg in "$@"; do
  case $arg in -*) ;; *) names_tests=true ;; esac
done
if ! $names_tests; then
  set -- "$@" tests/test_engine_*.py tests/test_*backend*.py tests/test_registry.py tests/test_torch_range.py
fi
start=$SECONDS
status=0
ACCEL_EXPECT_TORCH=$version "$venv/bin/python" -m pytest "$@" || status=$?
echo "ci/test-torch.sh: torch $version tests took $((SECONDS - start)) s (exit $status)" >&2
exit $status
