#!/usr/bin/env bash
# GPU check of the reference job (issue 4): one GPU, nccl, world size 1, profiler on, then the
# analyzer on what it wrote. Run it on a machine with a CUDA build of torch, fbgemm-gpu and
# torchrec (see README "GPU install"); it says what is missing instead of failing half-way.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]          (default: /tmp/fsobs_gpu_check)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
OUT=${1:-/tmp/fsobs_gpu_check}
rm -rf "$OUT" && mkdir -p "$OUT"

"$PY" - <<'PYCHECK'
import sys
try:
    import torch
except ImportError:
    sys.exit("gpu_check: torch is not installed")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device (a CPU build?)")
try:
    import fbgemm_gpu, torchrec  # noqa: F401
except Exception as exc:  # noqa: BLE001
    sys.exit(f"gpu_check: torchrec / fbgemm-gpu unusable: {exc}")
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())
print("device", torch.cuda.get_device_name(0))
PYCHECK
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
time "$PY" -m fsobs.cli run --world-size 1 --steps 12 --out "$OUT/run" --model-size small
"$PY" -m fsobs.cli analyze "$OUT/run"
"$PY" -m fsobs.cli analyze "$OUT/run" --json > "$OUT/analyze.json"
"$PY" - "$OUT" <<'PYCHECK'
import json, sys
out = sys.argv[1]
meta = json.load(open(f"{out}/run/run.json"))
result = json.load(open(f"{out}/analyze.json"))
assert meta["status"] == "complete" and meta["backend"] == "nccl" and meta["device"] == "cuda", meta
assert result["run"]["device"] == "gpu", result["run"]
assert result["hta"] is not None and result["hta"]["temporal_breakdown"], "no GPU kernels traced"
print("gpu_check: OK:", json.dumps(result["summary"]))
PYCHECK
