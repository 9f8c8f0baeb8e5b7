#!/usr/bin/env bash
# The second CI leg: the engine and backend tests on another torch, in its own virtual environment.
#
#   bash ci/test-torch.sh 2.10.0 [pytest options, e.g. -k faults -x]
#
# The environment is .venv-torch<VERSION> (or $ACCEL_VENV); it is reinstalled only when pyproject.toml or the
# constraints changed. Older torch exists on the registry only as the CUDA build (torch plus its CUDA libraries:
# about 4 GiB of wheels, 7.5 GiB installed); it imports and runs on a CPU-only machine. The wheels are downloaded
# once into a wheelhouse ($ACCEL_WHEELS, default ~/.cache/accel-backends/wheels-torch<VERSION>) and installed from
# there without the network afterwards: pip's own HTTP cache was seen not to keep them. Before either step the
# script checks the free disk space and stops with the figures if it is short (exit 77, which .ci/run reports as
# "not run"). --no-compile: Python compiles only the modules the tests import, not all of torch's.
# It runs the engine and backend tests (not GRPO, not the packaged plugins), pinned like the main leg
# (ci/constraints.txt) except for torch and setuptools (torch 2.12 requires setuptools<82; the main leg pins 84).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ACCEL_SCRIPT=ci/test-torch.sh
ACCEL_DISK_VARS="ACCEL_VENV / ACCEL_WHEELS"
source "$root/ci/venv-lib.sh"
version=${1:?usage: ci/test-torch.sh TORCH_VERSION [pytest options]}
shift
venv=${ACCEL_VENV:-$root/.venv-torch$version}
wheels=${ACCEL_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/accel-backends/wheels-torch$version}
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
{ grep -v -E '^(torch|setuptools)[=<>!~ ]' "$root/ci/constraints.txt"; echo "torch==$version"; } > "$constraints"

install_torch_and_tests() {
  echo "ci/test-torch.sh: installing torch $version and the test dependencies into $venv" >&2
  local offline=(install --quiet --no-cache-dir --no-compile --no-index --find-links "$wheels" -c "$constraints"
                 -e "$root[test]")
  local download=0 wheels_note=""
  compgen -G "$wheels/torch-$version-*.whl" > /dev/null || { download=4; wheels_note=", and 4 GiB of wheels"; }
  # Checked together when both live on one disk (the usual case): the wheels stay while the venv is filled.
  if [ "$(accel_mount "$venv")" = "$(accel_mount "$wheels")" ]; then
    accel_need_disk "$venv" $((download + 9)) "installing torch $version (about 7.5 GiB$wheels_note)" \
      || exit 77
  else
    accel_need_disk "$wheels" $((download + 1)) "downloading torch $version's wheels" || exit 77
    accel_need_disk "$venv" 9 "installing torch $version (about 7.5 GiB)" || exit 77
  fi
  if "$@" "${offline[@]}" 2>/dev/null; then
    return 0
  fi
  echo "ci/test-torch.sh: downloading the wheels into $wheels (first time: about 4 GiB)" >&2
  "$@" download --quiet --no-cache-dir --dest "$wheels" -c "$constraints" "$root[test]"
  "$@" "${offline[@]}"
}

accel_ensure_venv "$venv" "$constraints" install_torch_and_tests
installed=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
if [ "$installed" != "$version" ]; then
  echo "ci/test-torch.sh: $venv has torch $installed, not $version" >&2
  exit 1
fi
cd "$root"
start=$SECONDS
status=0
ACCEL_EXPECT_TORCH=$version "$venv/bin/python" -m pytest "$@" tests/test_engine_*.py tests/test_*backend*.py tests/test_conformance.py \
    tests/test_launch_in_process.py tests/test_checkpoint_compat.py tests/test_spawn.py tests/unit || status=$?
echo "ci/test-torch.sh: torch $version tests took $((SECONDS - start)) s (exit $status)" >&2
exit $status
