"""What a user of other people's traces notices in the report (issue 24, points 3 and 8):
HTA-rule values out of range are flagged, µs-scale runs print in µs, an empty host column and
all-zero idle rows go, and a folder of run folders names its runs. Values derived by hand."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import fsobs
from fsobs.analysis import analyze_path
from fsobs.report import findings, render, to_json
from tests.support.kineto import gemm, launch, step, trace, write, x


def _text(analysis: fsobs.Analysis) -> str:
    out = io.StringIO()
    render(analysis, Console(file=out, force_terminal=False, width=250))
    return out.getvalue()


def _lines_between(text: str, first: str, last: str | None = None) -> list[str]:
    """The lines of ``text`` from the one starting with ``first`` to the one starting with
    ``last`` (excluded; the end of the text without ``last``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    ends = [i for i, line in enumerate(lines) if i > start and last and line.startswith(last)]
    return lines[start : (ends or [len(lines)])[0]]


# ------------------------------------------------------ 3. HTA-rule rows out of range


def test_a_negative_hta_non_compute_time_is_flagged(tmp_path):
    """HTA rounds ts up and ts + dur down (fractional ts). A gemm [10.0, 20.0) stays [10, 20);
    two isolated memsets of 0.5 µs at 30.2 and 40.2 become [31, 30) and [41, 40), groups of
    length -1. All GPU rows merge to 10 - 1 - 1 = 8 µs; kernel_time 40 - 10 = 30, idle
    30 - 8 = 22, compute 10, so non_compute = 30 - 10 - 22 = -2 µs (-6.67%)."""
    events = [launch(1.0, 1), gemm(10.0, 10.0, corr=1)]
    for corr, ts in ((2, 30.2), (3, 40.2)):
        name = "Memset (Device)"
        memset = x(name, "gpu_memset", ts, 0.5, pid=0, tid=7, stream=7, correlation=corr)
        events += [launch(ts - 5, corr), memset]
    write(tmp_path / "rank0.json", trace(events))
    result = analyze_path(tmp_path)
    row = result.hta.temporal_breakdown.iloc[0]
    assert (row["idle_time_us"], row["compute_time_us"], row["kernel_time_us"]) == (22, 10, 30)
    flagged = [
        {"table": "temporal_breakdown", "rank": 0, "column": "non_compute_time_us", "value": -2.0},
        {"table": "temporal_breakdown", "rank": 0, "column": "non_compute_time_pctg"}
        | {"value": -6.67},
    ]
    assert to_json(result)["hta"]["out_of_range"] == flagged
    text = _text(result)
    assert "flagged: temporal_breakdown of rank 0: non_compute_time_us = -2.0 is out" in text
    assert "non_compute_time_pctg = -6.67 is out of range" in text


def test_values_in_range_are_not_flagged(tmp_path):
    write(tmp_path / "rank0.json", trace([launch(1, 1), gemm(10, 10, corr=1)]))
    result = analyze_path(tmp_path)
    assert to_json(result)["hta"]["out_of_range"] == []
    assert "flagged:" not in _text(result)


# --------------------------------------------------------- 8. what a user notices


def _us_scale(tmp_path, host: str) -> fsobs.Analysis:
    """One 40 µs window (ProfilerStep#1 [0, 100), its kernels [0, 10) and [30, 40)): busy 20,
    host_idle 20, bubble 50%. Two decimals of ms would print it as 0.04 and 0.02 ms."""
    events = [step(1, 0, 100), launch(1, 1), launch(2, 2)]
    events += [gemm(0, 10, corr=1), gemm(30, 10, corr=2)]
    write(tmp_path / "rank0.json", trace(events, host=host))
    return analyze_path(tmp_path)


def test_a_us_scale_run_is_printed_in_us(tmp_path):
    result = _us_scale(tmp_path, host="host-a")
    assert findings(result)[:2] == [
        "bubbles take 50.0% of step time: 20.0 µs per rank and step "
        "(step time p50 40.0 µs, by the GPU window)",
        "host idle dominates: 20.0 µs per step (100% of it)",
    ]
    text = _text(result)
    assert "Bubbles per rank (mean µs per step)" in text
    row = " ".join(next(line for line in text.splitlines() if line.startswith("│    0")).split())
    assert row.startswith("│ 0 │ 40.00 │ 20.00 │ 20.00 │")  # window, busy, bubble in µs
    assert to_json(result)["steps"][0]["window_ms"] == pytest.approx(0.040)  # JSON keeps ms


def test_the_host_column_is_shown_only_when_a_trace_names_its_host(tmp_path):
    named = _lines_between(_text(_us_scale(tmp_path / "a", host="host-a")), "Ranks", "GPU")
    assert "┃   host ┃" in named[2] and "│ host-a │" in named[4]
    nameless = _text(_us_scale(tmp_path / "b", host=""))
    ranks = _lines_between(nameless, "Ranks", "GPU temporal")
    assert not any("host" in line for line in ranks)


def test_all_zero_idle_rows_are_pruned_from_the_report_not_the_json(tmp_path):
    """Stream 7's gap [10, 30) is kernel_wait (the second kernel was launched at 2, before
    the first one ended, and the gap is under HTA's 30 µs); its ``other`` cause is 0 µs: HTA
    lists it, the report leaves it out."""
    result = _us_scale(tmp_path, host="host-a")
    idle = result.hta.idle_time_breakdown
    assert sorted(idle["idle_category"]) == ["kernel_wait", "other"]
    assert idle.set_index("idle_category")["idle_time_us"].to_dict() == {
        "kernel_wait": 20.0,
        "other": 0.0,
    }
    shown = _lines_between(_text(result), "GPU idle time by stream")
    assert any("kernel_wait" in line for line in shown)
    assert not any(" other " in line for line in shown)
    assert len(to_json(result)["hta"]["idle_time_breakdown"]) == 2


def test_a_folder_of_run_folders_names_its_runs(tmp_path):
    doc = trace([launch(1, 1), gemm(10, 10, corr=1)])
    write(tmp_path / "run-b" / "rank0.json", doc)
    write(tmp_path / "run-a" / "rank0.json", doc)
    write(tmp_path / "sweep" / "run-c" / "rank0.json.gz", doc)
    (tmp_path / "notes").mkdir()
    with pytest.raises(fsobs.EmptyRunError) as error:
        fsobs.load_run(tmp_path)
    assert str(error.value) == (
        f"{tmp_path}: no trace files (*.json, *.json.gz) in this directory; it holds run "
        "folder(s) with trace files (run-a, run-b, sweep/run-c) and a run is one folder of "
        f"trace files: analyze one of them, e.g. {tmp_path / 'run-a'}"
    )


def test_an_empty_folder_says_only_that(tmp_path):
    with pytest.raises(fsobs.EmptyRunError) as error:
        fsobs.load_run(tmp_path)
    assert str(error.value) == f"{tmp_path}: no trace files (*.json, *.json.gz) in this directory"
