#!/usr/bin/env bash
# GPU check of the optimizer and the reference job: one GPU, nccl, world size 1.
#   1. the optimizer API, torch only (benchmarks/gpu_freescale_check.py): groups, stream
#      priority, the dense comm hook and its gate, the comm router, sm_free where it applies;
#   2. with torchrec (1.9.2) and fbgemm-gpu installed: the reference job with every toggle,
#      profiled, then the analyzer on what it wrote: priority_overlap runs torchrec's PEC
#      pipeline on NCCL (optim.pec on CUDA: torchrec's own path, the gradient fixes), and the
#      analysis finds PEC's collectives by role. Without them this part says it is skipped.
# It runs with what a GPU machine without network has (its own torch) plus this checkout.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]          (default: /tmp/fsobs_gpu_check)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
OUT=${1:-/tmp/fsobs_gpu_check}
rm -rf "$OUT" && mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'PYCHECK'
import sys
try:
    import torch
except ImportError:
    sys.exit("gpu_check: torch is not installed")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device (a CPU build?)")
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())
print("device", torch.cuda.get_device_name(0))
PYCHECK
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

"$PY" benchmarks/gpu_freescale_check.py

if ! "$PY" -c "import fbgemm_gpu, torchrec" 2>/dev/null; then
    echo "gpu_check: SKIPPED the reference job: torchrec / fbgemm-gpu are not installed here"
    exit 0
fi
time "$PY" -m fsobs.cli run --world-size 1 --steps 12 --out "$OUT/run" --model-size small \
    --priority-overlap --sm-free --item-popularity 1.1
"$PY" -m fsobs.cli analyze "$OUT/run"
"$PY" -m fsobs.cli analyze "$OUT/run" --json > "$OUT/analyze.json"
"$PY" - "$OUT" <<'PYCHECK'
import json, sys
out = sys.argv[1]
meta = json.load(open(f"{out}/run/run.json"))
result = json.load(open(f"{out}/analyze.json"))
assert meta["status"] == "complete" and meta["backend"] == "nccl" and meta["device"] == "cuda", meta
assert meta["toggles"]["priority_overlap"]["applied"], meta["toggles"]
assert meta["toggles"]["priority_overlap"]["reason"].startswith("torchrec's PEC"), meta["toggles"]
pec = {k: v for k, v in result["by_role"].items() if k.startswith("pec_")}
assert {"pec_overlapped", "pec_ahead", "pec_mask"} <= set(pec), result["by_role"]
print("gpu_check: PEC roles (ms per rank and step):", json.dumps(pec))
assert result["run"]["device"] == "gpu", result["run"]
assert result["hta"] is not None and result["hta"]["temporal_breakdown"], "no GPU kernels traced"
print("gpu_check: toggles:", json.dumps(meta["toggles"]))
print("gpu_check: OK:", json.dumps(result["summary"]))
PYCHECK
