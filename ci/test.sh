#!/usr/bin/env bash
# The test command: the lint gate, then the suite in stages, in this order (docs/testing.md):
#   unit  tests/unit: every pure, in-process test (seconds); -x, so a broken build fails here, before the slow stages
#   main  every other test: multi-rank jobs on the session's warm pool of 2 gloo ranks, end-to-end runs shared
#         by the tests that assert on them (session fixtures)
#   npu   the NPU stand-in's contract tests, in a process of their own (the stand-in renames torch's private-use
#         device for the rest of the process)
# Each stage is one pytest run; the first failing stage ends the command with its status. The unit and main stages
# spread their test files over ACCEL_TEST_WORKERS pytest-xdist workers (default 2; 1 runs them in one process), a
# whole file to a worker (its shared end-to-end runs happen once), the costliest files first (tests/conftest.py).
#   bash ci/test.sh                     every stage
#   bash ci/test.sh unit                one stage (or several: `main npu`); extra arguments go to pytest:
#   bash ci/test.sh main -k faults -x
#   bash ci/test.sh tests/test_spawn.py arguments that name no stage: one pytest run with just them
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/ci/lint.sh"
cd "$root"
python=${ACCEL_VENV:-$root/.venv}/bin/python
NPU=tests/test_npu_backend_contract.py
workers=${ACCEL_TEST_WORKERS:-2}
spread=()
if [ "$workers" -gt 1 ]; then
  spread=(-n "$workers" --dist loadfile --no-loadscope-reorder)
  # One thread per worker unless told: a one-rank run in a worker would take every core, and with two workers their
  # OpenMP threads would spin against each other (about a minute of CPU time more over the main stage, measured).
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi

stages=()
while [ "$#" -gt 0 ] && [[ "$1" =~ ^(unit|main|npu)$ ]]; do
  stages+=("$1")
  shift
done
if [ "${#stages[@]}" -eq 0 ]; then
  if [ "$#" -gt 0 ]; then
    exec "$python" -m pytest "$@"
  fi
  stages=(unit main npu)
fi

for stage in "${stages[@]}"; do
  start=$SECONDS
  echo "ci/test.sh: stage $stage" >&2
  case $stage in
    unit) "$python" -m pytest -x "${spread[@]}" tests/unit "$@" ;;
    main) "$python" -m pytest "${spread[@]}" tests --ignore=tests/unit --ignore="$NPU" "$@" ;;
    npu) "$python" -m pytest "$NPU" "$@" ;;
  esac
  echo "ci/test.sh: stage $stage passed in $((SECONDS - start)) s" >&2
done
