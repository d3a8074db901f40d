"""CUDA graph replays and torch.compile kernels (issue 36, point 8; HTA #290, where kernels a
``cudaGraphLaunch`` replays went missing from HTA's critical path): each is attributed to the
step of the host call that launched it.

CUPTI gives every kernel of one graph replay the correlation id of its ``cudaGraphLaunch``
(one launch, many kernels); Triton kernels of torch.compile are launched through the driver
(``cuLaunchKernel``, ``cuLaunchKernelEx``: category ``cuda_driver``). A hand-built rank
(host calls: the graph launches at 5 and 105, cuLaunchKernelEx at 8, cuLaunchKernel at 110)::

    t (µs)   0      20  30 35 45 50 60 65 70      100     120 130 135 145 150 160 165 170
    CPU      |------ProfilerStep#1------------------|------ProfilerStep#2--------------|
    GPU             |g1-|  |g2-|  |g3-| |t|                |g1-|  |g2-|  |g3-|  |t|

Step 1 launched the graph's g1 g2 g3 (corr 7) and one Triton kernel t (corr 12, at 65):
window [20, 120) (its first kernel to step 2's first), busy 3 x 10 + 5 = 35, the rest of
the 100 µs host idle (65). Step 2 launched the graph again (corr 9) and a Triton kernel (corr
11, at 165): window [120, 170), busy 35, host idle 15. No kernel is left outside a window or
counted without a launch.
"""

from __future__ import annotations

from fsobs.analysis import analyze_path
from tests.support.bubble_rows import expect_row
from tests.support.kineto import gemm, kernel, step, trace, write, x


def _host(name: str, cat: str, ts: float, corr: int) -> dict:
    event = x(name, cat, ts, 2)
    event["args"] = {"correlation": corr}
    return event


def _doc() -> dict:
    events = [step(1, 0, 100), step(2, 100, 100)]
    events += [_host("cudaGraphLaunch", "cuda_runtime", 5, 7)]
    events += [gemm(20, 10, corr=7), gemm(35, 10, corr=7), gemm(50, 10, corr=7)]
    events += [_host("cuLaunchKernelEx", "cuda_driver", 8, 12)]
    events += [kernel("triton_poi_fused_add_0", 65, 5, corr=12)]
    events += [_host("cudaGraphLaunch", "cuda_runtime", 105, 9)]
    events += [gemm(120, 10, corr=9), gemm(135, 10, corr=9), gemm(150, 10, corr=9)]
    events += [_host("cuLaunchKernel", "cuda_driver", 110, 11)]
    events += [kernel("triton_poi_fused_add_0", 165, 5, corr=11)]
    return trace(events)


def test_graph_replays_and_compiled_kernels_belong_to_their_launchs_step(tmp_path):
    write(tmp_path / "rank0.json", _doc())
    result = analyze_path(tmp_path)
    table = result.steps.set_index(["rank", "step"])
    expect_row(table, 0, 1, window=100, busy=35, host_idle=65)
    expect_row(table, 0, 2, window=50, busy=35, host_idle=15)
    windows = result.windows.iloc[0]
    assert (windows["unlaunched_events"], windows["outside_events"]) == (0, 0)
