#!/usr/bin/env bash
# SM-free communication on one GPU: GEMMs overlapped with an SM-based transfer and
# with a copy-engine transfer of the same bytes, traced and analyzed by fsobs, plus an API
# probe of NCCL, its CTA policies and symmetric memory; a table at the end.
# Needs torch with CUDA; fsobs needs msgspec, numpy, pandas and rich (carry msgspec as a wheel
# on a machine without network: see the device tool's README).
#
#   bash benchmarks/gpu_sm_free.sh [OUT_DIR]        (default: /tmp/fsobs_gpu_sm_free)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$PY" benchmarks/gpu_sm_free.py "${1:-/tmp/fsobs_gpu_sm_free}"
