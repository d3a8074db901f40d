"""What SM-free communication buys on one GPU: GEMMs slowed by an SM-based transfer, not by a
copy-engine one. Torch only, plus fsobs from this checkout (msgspec, numpy, pandas,
rich: carry msgspec as a wheel on a machine without network).

    bash benchmarks/gpu_sm_free.sh [OUT_DIR]

NCCL refuses two ranks on one GPU, so a real multi-rank copy-engine all-to-all cannot run on
a one-GPU machine. This measures what it would remove, with the same bytes moved three ways
while a stream of bf16 GEMMs runs on the default stream, one ProfilerStep per repetition:

- ``none``: the GEMMs alone;
- ``sm_copy``: a strided copy on a side stream (an elementwise kernel: it takes SMs, as
  NCCL's kernels do), launched inside ``## fsobs:comm:embedding:0 ##``, so fsobs counts it
  as communication;
- ``ce_copy``: the same bytes with contiguous ``copy_`` (``cudaMemcpyAsync`` device to device)
  plus a pinned host-to-device copy, on a side stream: copy engines, no SMs.

Each arm is traced by torch.profiler and analyzed by fsobs (contention per step: the extra
GEMM time under SM-based communication). The GEMM slowdown is read from the kernels
themselves: median duration of GEMMs that overlap a transfer over the median alone (arm none).
A probe of the NCCL version, ``NCCL_CTA_POLICY_ZERO`` and symmetric memory comes first; a table
comes last.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEPS, GEMMS, N = 12, 8, 8192
COPY_MB = 512


def probe() -> dict[str, object]:
    import torch.distributed as dist

    nccl = getattr(dist, "ProcessGroupNCCL", None)
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm = all(hasattr(symm_mem, f) for f in ("set_backend", "get_mem_pool", "rendezvous"))
    except ImportError:
        symm = False
    return {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "NCCL_CTA_POLICY_ZERO": hasattr(nccl, "NCCL_CTA_POLICY_ZERO"),
        "NCCL_CTA_POLICY_EFFICIENCY": hasattr(nccl, "NCCL_CTA_POLICY_EFFICIENCY"),
        "symmetric_memory": symm,
    }


def arm(name: str, out: Path) -> Path:
    """Trace STEPS repetitions of the arm; returns the trace file."""
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    elems = COPY_MB * 2**20 // 2
    src = torch.randn(elems, device="cuda", dtype=torch.bfloat16)
    strided = torch.randn(2 * elems, device="cuda", dtype=torch.bfloat16)[::2]
    dst = torch.empty_like(src)
    host = torch.randn(elems // 4, dtype=torch.bfloat16).pin_memory()
    dev = torch.empty(elems // 4, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    trace = out / name / "rank0.trace.json.gz"
    trace.parent.mkdir(parents=True, exist_ok=True)
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=STEPS),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
    )
    with profiler:
        for _ in range(STEPS + 2):
            side.wait_stream(torch.cuda.current_stream())
            with (
                torch.cuda.stream(side),
                torch.autograd.profiler.record_function("## fsobs:comm:embedding:0 ##"),
            ):
                if name == "sm_copy":
                    dst.copy_(strided)  # elementwise kernel on SMs
                elif name == "ce_copy":
                    dst.copy_(src)  # cudaMemcpyAsync device to device
                    dev.copy_(host, non_blocking=True)  # pinned host to device: copy engine
            for _ in range(GEMMS):
                torch.mm(a, b)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            profiler.step()
    return trace


def gemm_stats(trace: Path) -> dict[str, float]:
    """GEMM kernel durations (µs), split by whether a transfer (any other stream's work)
    overlaps them, from the fsobs event table."""
    import fsobs

    events = fsobs.load_rank(trace).events
    gpu = events[events["device"] == "gpu"]
    gemm = gpu[gpu["name"].str.contains("gemm|Gemm|cutlass|nvjet|sm90", regex=True)]
    other = gpu[~gpu.index.isin(gemm.index) & (gpu["kind"].isin(["comm", "memcpy", "compute"]))]
    spans = sorted(zip(other["ts_ns"], other["ts_ns"] + other["dur_ns"], strict=True))
    overlapped, alone = [], []
    for start, dur in zip(gemm["ts_ns"], gemm["dur_ns"], strict=True):
        hit = any(s < start + dur and e > start for s, e in spans)
        (overlapped if hit else alone).append(dur / 1e3)
    return {
        "gemms": len(gemm),
        "median_alone_us": statistics.median(alone) if alone else float("nan"),
        "median_overlapped_us": statistics.median(overlapped) if overlapped else float("nan"),
        "overlapped": len(overlapped),
    }


def main() -> int:
    if not torch.cuda.is_available():
        print(f"gpu_sm_free: torch {torch.__version__} sees no CUDA device: skipped")
        return 0
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fsobs_gpu_sm_free")
    print("probe", json.dumps(probe()))
    traces = {name: arm(name, out) for name in ("none", "sm_copy", "ce_copy")}
    try:
        from fsobs.analysis import analyze_path
    except ImportError as exc:
        print(f"gpu_sm_free: fsobs cannot load here ({exc}): traces kept in {out}")
        return 1
    base = gemm_stats(traces["none"])["median_alone_us"]
    print("| arm | copy | GEMMs overlapped | GEMM median alone / overlapped (µs) | slowdown "
          "| fsobs contention ms/step |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, trace in traces.items():
        stats = gemm_stats(trace)
        summary = analyze_path(trace.parent).summary
        slowdown = stats["median_overlapped_us"] / base if stats["overlapped"] else float("nan")
        print(
            f"| {name} | {COPY_MB if name != 'none' else 0} MB | {stats['overlapped']} of "
            f"{stats['gemms']} | {stats['median_alone_us']:.1f} / "
            f"{stats['median_overlapped_us']:.1f} | {slowdown:.3f} | "
            f"{summary['contention_ms_per_step']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
