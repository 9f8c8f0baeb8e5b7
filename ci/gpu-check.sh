#!/usr/bin/env bash
# One check of a machine with a GPU, made for a lent 10-minute slot (nothing installed; the image's python3 with
# torch, transformers, peft, pluggy, pytest, pyarrow, tensorboard): the cuda tests, the conformance kit, the report
# card in fp32 and bf16 (one GPU: multi-rank properties on torch's fake process group), GRPO and SFT steps at
# Qwen2.5-0.5B's and Qwen3-1.7B's geometry, the engine-overhead bench. Each step has its own time limit inside
# 580 s; this wrapper stops everything at 595 s. Results (gpu-check.json, gpu-check.md, gpu-check.log)
# go to $OUT when set, else runs/gpu-check/, rewritten as each step ends. Options: --cpu (the rehearsal: CPU
# backend, tiny geometry), --geometry NAME (repeatable), --dry-run, --only STEP[,STEP], --out DIR (ci/gpu_check.py).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec timeout -k 10 595 "${PYTHON:-python3}" ci/gpu_check.py "$@"
