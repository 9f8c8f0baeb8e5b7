#!/usr/bin/env bash
# One check of a machine with an NVIDIA GPU whose python3 already has torch, transformers, peft, pluggy, pytest
# (nothing is installed): the cuda-marked tests, the conformance kit for cuda, ci/bench.sh on one process with a
# ~0.5B-parameter bf16 model built from a config, and a short GRPO run (and one with rollout.engine=vllm where vLLM
# is importable); within 8 minutes (10 with vLLM), all figures in one JSON
# (default runs/gpu-check.json). Options: --cpu (same steps, CPU backend, tiny model: checks this script
# anywhere), --dry-run (print the commands), --only STEP[,STEP], --json PATH.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 900 "${PYTHON:-python3}" ci/gpu_check.py "$@"
