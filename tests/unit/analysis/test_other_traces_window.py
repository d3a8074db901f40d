"""Traces of other jobs, what the step windows cover (issue 24, points 1 and 3): a step marker
whose ranges launch no GPU work, GPU work no recorded step launched (inside a window: counted;
outside every window: counted and reported as left out), an almost empty GPU timeline, and the
clock of the step time. Values are derived by hand from the rules of
:mod:`fsobs.analysis.bubbles.windows` (times in µs; ``u`` marks work no step launched).
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

import fsobs
from fsobs.analysis import analyze_path
from fsobs.cli import main
from fsobs.report import findings, render, to_json
from tests.support.bubble_rows import checked_table, expect_row, load_docs
from tests.support.kineto import cpu_doc, cpu_op, gemm, gloo, launch, memcpy, step, trace, write, x


def _text(analysis: fsobs.Analysis) -> str:
    out = io.StringIO()
    render(analysis, Console(file=out, force_terminal=False, width=250))
    return out.getvalue()


def _window(analysis: fsobs.Analysis, rank: int = 0) -> dict:
    return analysis.windows.set_index("rank").loc[rank].to_dict()


# ------------------------------------------------- 1. a step marker over CPU-only ranges


def _cpu_only_ranges() -> list[dict]:
    """Two ``data`` ranges that launch nothing; both kernels are launched between them::

    t (µs)   0        50  55 58 60   80  100  120   140  150
    CPU      |--data--|   L  L          |------data------|
    GPU                        |uu|           |uu|
    """
    return [
        x("data", "user_annotation", 0, 50),
        x("data", "user_annotation", 100, 50),
        launch(55, 1),
        launch(58, 2),
        gemm(60, 20, corr=1),
        gemm(120, 20, corr=2),
    ]


def test_a_step_marker_over_ranges_that_launch_no_gpu_work_uses_their_cpu_ranges(tmp_path):
    """No ``data`` range launched GPU work, so there is no GPU window: each range is its own
    window (clock ``cpu``) and the GPU is classified during it. Window 0 = [0, 50): nothing
    runs, host_idle 50. Window 1 = [100, 150): the kernel [120, 140) runs inside it, busy 20,
    host_idle 30; no step launched it (counted there: 1 event, 20 µs). The kernel [60, 80)
    lies outside both: 1 event, 20 µs left out."""
    write(tmp_path / "rank0.json", trace(_cpu_only_ranges()))
    run = fsobs.load_run(tmp_path, fsobs.LoadConfig(step_marker="data"))
    table = checked_table(run)
    expect_row(table, 0, 0, window=50, busy=0, host_idle=50)
    expect_row(table, 0, 1, window=50, busy=20, host_idle=30)

    result = fsobs.analyze(run)
    row = _window(result)
    assert row["clock"] == "cpu" and row["windows"] == 2
    assert row["window_ms_mean"] == pytest.approx(0.050)
    assert row["cpu_step_ms_mean"] == pytest.approx(0.050)
    assert row["gpu_work_ms"] == pytest.approx(0.020)
    assert (row["unlaunched_events"], row["outside_events"]) == (1, 1)
    assert row["unlaunched_ms"] == pytest.approx(0.020)
    assert row["outside_ms"] == pytest.approx(0.020)
    assert row["no_window_steps"] == [] and not row["sparse_gpu"]  # windows = CPU ranges
    lines = findings(result)
    assert any(line.startswith("no step launched GPU work on rank(s) 0") for line in lines)
    assert "by the CPU 'data' range" in lines[0]


def test_the_cli_reports_a_step_marker_without_gpu_work(tmp_path, capsys):
    """The crash of issue 24 (``need at least one array to concatenate``): a report instead."""
    write(tmp_path / "rank0.json", trace(_cpu_only_ranges()))
    assert main(["analyze", str(tmp_path), "--step-marker", "data"]) == 0
    assert "no step launched GPU work" in capsys.readouterr().out
    assert main(["analyze", str(tmp_path), "--step-marker", "data", "--json"]) == 0


def test_a_step_that_launched_no_gpu_work_has_no_window_and_is_named(tmp_path):
    """ProfilerStep#1 [0, 100) launches a kernel [10, 30); #2 [100, 200) launches nothing.
    Step 1's window is its kernel: [10, 30), busy 20; step 2 has no window on this rank."""
    events = [step(1, 0, 100), step(2, 100, 100), launch(5, 1), gemm(10, 20, corr=1)]
    write(tmp_path / "rank0.json", trace(events))
    result = analyze_path(tmp_path)
    assert result.run.steps == [1, 2]
    assert result.steps["step"].tolist() == [1]
    expect_row(result.steps.set_index(["rank", "step"]), 0, 1, window=20, busy=20)
    assert _window(result)["no_window_steps"] == [2]
    assert "step(s) 2 launched no GPU work on rank 0: no window there" in "\n".join(
        findings(result)
    )


def test_a_gpu_rank_without_any_window_gets_a_report(tmp_path):
    """Only a GPU annotation and no CPU event: no window at all, yet a report (no crash)."""
    events = [x("## fwd ##", "gpu_user_annotation", 0, 10, pid=0, tid=7)]
    write(tmp_path / "rank0.json", trace(events))
    result = analyze_path(tmp_path)
    assert result.steps.empty and _window(result)["windows"] == 0
    assert findings(result)[0] == "no step window on every rank: no bubble breakdown"
    assert "no step window" in _text(result)
    assert to_json(result)["windows"][0]["windows"] == 0


@pytest.mark.parametrize(
    ("events", "first"),
    [
        ([], "no step window on every rank: no bubble breakdown"),
        (
            [gemm(0, 10, corr=5)],  # whole trace: the window is the kernel
            "bubbles take 0.0% of step time: 0.0 µs per rank and step (step time p50 10.0 µs, "
            "by the GPU window); the window is the whole trace (no ProfilerStep): it spans all "
            "the profiler recorded, its start and stop and the time between iterations "
            "included, not one training step",
        ),
        (
            [step(1, 0, 0), launch(0, 1), gemm(0, 0, corr=1)],
            "every step window has zero length: no bubble breakdown",
        ),
        (
            [step(1, 0, 10)],  # a CPU rank: its step is busy glue
            "bubbles take 0.0% of step time: 0.0 µs per rank and step (step time p50 10.0 µs, "
            "by the CPU ProfilerStep)",
        ),
    ],
)
def test_any_trace_the_loader_accepts_gets_a_report(tmp_path, events, first):
    write(tmp_path / "rank0.json", trace(events))
    result = analyze_path(tmp_path)
    assert findings(result)[0] == first
    assert _text(result).startswith(f"{tmp_path}: ")
    json.dumps(to_json(result), allow_nan=False)


# ----------------------------------------- 3. GPU work no recorded step launched


def _unlaunched_doc(host: str = "host-a") -> dict:
    """Two steps; three kernels (``u``, correlation ids 90-92) have no launch in the trace::

        t (µs)   0  5  15 20   40  50   70       100  120     150 160 170  200
        CPU      |------ProfilerStep#1------------|-------ProfilerStep#2------|
        GPU         |uu|  |k1-|    |uu-|              |k2------| |uu|
        windows          [------------ 1 --------------)[-- 2 --)

    Window 1 = [20, 120) (k1 to k2's start): busy k1 20 + u 20 = 40, host_idle 60; one
    unlaunched event (20 µs) counted in it. Window 2 = [120, 150): busy 30. Outside every
    window: [5, 15) before the first and [160, 170) after the last, 2 events, 20 µs.
    """
    events = [step(1, 0, 100), step(2, 100, 100), launch(1, 1), launch(101, 2)]
    events += [gemm(20, 20, corr=1), gemm(120, 30, corr=2)]
    events += [gemm(5, 10, corr=90), gemm(50, 20, corr=91), gemm(160, 10, corr=92)]
    return trace(events, host=host)


def test_unlaunched_gpu_work_inside_a_window_counts_and_outside_is_left_out(tmp_path):
    run = load_docs(tmp_path, [_unlaunched_doc()])
    table = checked_table(run)
    expect_row(table, 0, 1, window=100, busy=40, host_idle=60)
    expect_row(table, 0, 2, window=30, busy=30)
    result = fsobs.analyze(run)
    row = _window(result)
    assert row["clock"] == "gpu"
    assert (row["unlaunched_events"], row["outside_events"]) == (1, 2)
    assert row["unlaunched_ms"] == pytest.approx(0.020)
    assert row["outside_ms"] == pytest.approx(0.020)
    assert row["gpu_work_ms"] == pytest.approx(0.070)  # k1 20 + u 20 + k2 30
    assert row["window_ms_mean"] == pytest.approx(0.065)  # (100 + 30) / 2
    assert row["cpu_step_ms_mean"] == pytest.approx(0.100)
    lines = findings(result)
    assert (
        "1 GPU event(s) that no recorded step launched ran inside the windows of rank(s) 0 "
        "(20.0 µs): counted there" in lines
    )
    assert any(
        line.startswith("2 GPU event(s) ran outside every step window on rank(s) 0 (20.0 µs")
        for line in lines
    )
    assert to_json(result)["windows"][0]["outside_events"] == 2


def test_the_step_time_names_its_clock_and_the_ranks_table_shows_both(tmp_path):
    """Step times 100 and 30 µs by the GPU windows (p50 65 µs), 100 µs by the ProfilerSteps:
    the headline names the GPU window; the Ranks table has both, in µs (a µs-scale run)."""
    result = fsobs.analyze(load_docs(tmp_path, [_unlaunched_doc()]))
    assert findings(result)[0] == (
        "bubbles take 46.2% of step time: 30.0 µs per rank and step "
        "(step time p50 65.0 µs, by the GPU window)"
    )  # bubble (60 + 0) / 2 = 30 µs, 60 / 130 = 46.2%
    assert to_json(result)["run"]["step_clock"] == "GPU window"
    text = _text(result)
    assert "CPU step µs (mean) ┃ window µs (mean) ┃ window clock" in text
    assert "│ 100.00 │ 65.00 │ GPU window │" in " ".join(text.split())


@pytest.mark.parametrize(
    ("steps", "marker", "clock"),
    [
        (((1, 0, 100),), None, "CPU ProfilerStep"),
        ((), "work", "CPU 'work' range"),
        ((), None, "CPU span of the whole trace"),
    ],
)
def test_a_cpu_run_names_the_cpu_range_it_is_timed_by(tmp_path, steps, marker, clock):
    """A gloo rank: mm [0, 30), all_reduce [30, 50) with nobody to wait for."""
    work = [x("work", "user_annotation", 0, 100), cpu_op("aten::mm", 0, 30)]
    work.append(gloo("all_reduce", 30, 20))
    write(tmp_path / "rank0.json", cpu_doc(0, work, world_size=1, steps=steps))
    result = analyze_path(tmp_path, fsobs.LoadConfig(step_marker=marker))
    headline = findings(result)[0]
    whole = (
        "; the window is the whole trace (no ProfilerStep): it spans all the profiler recorded, "
        "its start and stop and the time between iterations included, not one training step"
    )  # issue 36, point 5: a whole-trace window says so, the others do not
    assert headline.endswith(f", by the {clock})" + (whole if not steps and not marker else ""))
    assert _window(result)["clock"] == "cpu"


# ------------------------------------------------------- 3. an almost empty GPU timeline


def _capture_doc(gpu_us: float) -> dict:
    """A 100 ms ProfilerStep whose only GPU work is one copy of ``gpu_us`` µs (a trace of CUDA
    graph capture: the CPU launches, the GPU hardly runs)."""
    events = [step(1, 0, 100_000), launch(10, 1), memcpy(50, gpu_us, stream=7)]
    events[-1]["args"]["correlation"] = 1
    return trace(events)


def test_an_almost_empty_gpu_timeline_gets_a_warning_not_a_bubble_verdict(tmp_path):
    """A 5 µs window (the copy alone) against a 100 ms CPU step (0.005%): its bubble would
    read 100% "other"; the report says the timeline is almost empty instead of giving a
    bubble verdict."""
    write(tmp_path / "rank0.json", _capture_doc(5))
    result = analyze_path(tmp_path)
    assert _window(result)["sparse_gpu"]
    lines = findings(result)
    assert not any(line.startswith("bubbles take") for line in lines)
    assert lines == [
        "the GPU timeline of rank(s) 0 is almost empty: its step windows span 5.0 µs against "
        "100.00 ms of CPU steps (0.01%; a trace of CUDA graph capture, or GPU activity the "
        "profiler did not record): its bubble numbers describe those few events, not the job"
    ]


@pytest.mark.parametrize(("gpu_us", "sparse"), [(999, True), (1000, False)])
def test_almost_empty_means_under_one_percent_of_the_cpu_steps(tmp_path, gpu_us, sparse):
    """1% of the 100 ms step is 1000 µs: windows spanning less count as almost empty."""
    write(tmp_path / "rank0.json", _capture_doc(gpu_us))
    result = analyze_path(tmp_path)
    assert _window(result)["sparse_gpu"] is sparse
    assert findings(result)[0].startswith("bubbles take") is not sparse


# ------------------------------------------- issue 36, point 3: a trace of CUDA graph capture


def _captured_doc() -> dict:
    """A 100 µs step that captures a graph: the stream captures [5, 80), two kernels launched
    inside (recorded, and here also shown as run, as some traces show them), the graph
    instantiated. The GPU window is [20, 50) (first kernel to last): busy 20, 10 µs between
    the kernels, a bubble of 33.3% that is the capture's::

        t (µs)   0  5  10   20   30  40    80  90  100
        CPU      |--ProfilerStep#1-----------------------|
                    |BeginCapture ... EndCapture|Inst|
        GPU               |k1-|     |k2-|
    """
    events = [step(1, 0, 100)]
    events += [x("cudaStreamBeginCapture", "cuda_runtime", 5, 1)]
    events += [launch(10, 1), launch(12, 2), gemm(20, 10, corr=1), gemm(40, 10, corr=2)]
    events += [x("cudaStreamEndCapture", "cuda_runtime", 80, 2)]
    events += [x("cudaGraphInstantiate", "cuda_runtime", 85, 5)]
    return trace(events)


def test_a_trace_of_cuda_graph_capture_says_so_first(tmp_path):
    """The issue's capture trace read "bubbles take 97.6% ... host idle dominates" without a
    word: the first line now names the capture (3 calls: begin, end, instantiate) and the
    numbers follow, marked as the capture's."""
    write(tmp_path / "rank0.json", _captured_doc())
    result = analyze_path(tmp_path)
    assert result.overview["graph_capture_calls"].tolist() == [3]
    lines = findings(result)
    assert lines[0] == (
        "the trace of rank(s) 0 records CUDA graph capture (3 cudaStreamBeginCapture / "
        "EndCapture / cudaGraphInstantiate call(s)): kernels launched while a stream captures "
        "are recorded into the graph, not run, so the GPU timeline here is the capture's and "
        "its bubble is not the job's; profile steps that replay the graph (cudaGraphLaunch)"
    )
    assert lines[1].startswith("bubbles take 33.3% of step time")  # window [20, 50): 10 idle
    # a trace that only replays graphs is no capture
    replay = trace([step(1, 0, 100), x("cudaGraphLaunch", "cuda_runtime", 5, 1)])
    write(tmp_path / "replay" / "rank0.json", replay)
    assert analyze_path(tmp_path / "replay").overview["graph_capture_calls"].tolist() == [0]
