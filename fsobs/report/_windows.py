"""What the reports say about the step windows: their clock, the GPU work they leave out or
count without a launch, an almost empty GPU timeline (:attr:`Analysis.windows`), and HTA-rule
rows whose values fall outside their range."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fsobs.analysis import Analysis
from fsobs.report._format import duration, short_list, time_unit
from fsobs.report._json import plain


def clock_label(clock: str, step_source: str) -> str:
    """What times a window, for people: ``GPU window``, ``CPU ProfilerStep``, ``CPU
    'train_step' range`` (a step marker), ``CPU span of the whole trace``."""
    if clock == "gpu":
        return "GPU window"
    if step_source == "ProfilerStep":
        return "CPU ProfilerStep"
    if step_source == "whole trace":
        return "CPU span of the whole trace"
    return f"CPU '{step_source}' range"


def rank_clocks(analysis: Analysis) -> pd.Series:
    """The :func:`clock_label` of every rank, indexed by rank."""
    windows = analysis.windows
    sources = [analysis.run.ranks[int(r)].step_source for r in windows["rank"]]
    labels = [clock_label(c, s) for c, s in zip(windows["clock"], sources, strict=True)]
    return pd.Series(labels, index=windows["rank"].to_numpy(), dtype=object)


def run_clock(analysis: Analysis) -> str:
    """The clocks of the run's step times, ``GPU window`` or ``GPU window / CPU ProfilerStep``
    when the ranks differ."""
    return " / ".join(sorted(set(rank_clocks(analysis)))) or "no window"


def all_sparse(analysis: Analysis) -> bool:
    """Every rank's GPU timeline is almost empty (see :mod:`fsobs.analysis.bubbles.coverage`)."""
    sparse = analysis.windows["sparse_gpu"]
    return bool(len(sparse)) and bool(sparse.all())


def window_findings(analysis: Analysis) -> list[str]:
    """What the windows leave out, count without a launch, or cannot show."""
    w = analysis.windows
    gpu = w[[analysis.run.ranks[int(r)].device == "gpu" for r in w["rank"]]]
    lines = []
    fallback = gpu[gpu["clock"] == "cpu"]
    if len(fallback):
        lines.append(
            f"no step launched GPU work on rank(s) {short_list(fallback['rank'])} (their step "
            "ranges run CPU code only, or the launches are not in the trace): the windows "
            "there are the steps' CPU ranges, and the GPU is looked at during them"
        )
    for rank, steps in zip(w["rank"].tolist(), w["no_window_steps"], strict=True):
        if not steps:
            continue
        on_gpu = analysis.run.ranks[rank].device == "gpu"
        lines.append(
            f"step(s) {short_list(steps)} "
            f"{'launched no GPU work' if on_gpu else 'have no CPU event'} on rank {rank}: "
            "no window there, left out of its numbers"
        )
    inside = gpu[gpu["unlaunched_events"] > 0]
    if len(inside):
        lines.append(
            f"{int(inside['unlaunched_events'].sum())} GPU event(s) that no recorded step "
            f"launched ran inside the windows of rank(s) {short_list(inside['rank'])} "
            f"({_duration(float(inside['unlaunched_ms'].sum()))}): counted there"
        )
    outside = gpu[gpu["outside_events"] > 0]
    if len(outside):
        lines.append(
            f"{int(outside['outside_events'].sum())} GPU event(s) ran outside every step "
            f"window on rank(s) {short_list(outside['rank'])} "
            f"({_duration(float(outside['outside_ms'].sum()))} of GPU time; work whose "
            "launch is not in the trace, such as work queued before the profiler started, or "
            "launched outside the recorded steps): left out"
        )
    return lines + _sparse_findings(gpu)


def capture_findings(analysis: Analysis) -> list[str]:
    """The ranks whose trace records CUDA graph capture (``graph_capture_calls`` of
    :attr:`Analysis.overview`), in one line: their GPU timeline is the capture's."""
    overview = analysis.overview
    if "graph_capture_calls" not in overview or not overview["graph_capture_calls"].sum():
        return []
    capturing = overview[overview["graph_capture_calls"] > 0]
    return [
        f"the trace of rank(s) {short_list(capturing['rank'])} records CUDA graph capture "
        f"({int(capturing['graph_capture_calls'].sum())} cudaStreamBeginCapture / "
        "EndCapture / cudaGraphInstantiate call(s)): kernels launched while a stream captures "
        "are recorded into the graph, not run, so the GPU timeline here is the capture's and "
        "its bubble is not the job's; profile steps that replay the graph (cudaGraphLaunch)"
    ]


def _duration(ms: float) -> str:
    """``ms`` in its own unit (:func:`~fsobs.report._format.time_unit`)."""
    return duration(ms, time_unit(ms))


def _sparse_findings(gpu: pd.DataFrame) -> list[str]:
    sparse = gpu[gpu["sparse_gpu"]]
    if not len(sparse):
        return []
    span = float((sparse["window_ms_mean"] * sparse["windows"]).sum())
    cpu = float((sparse["cpu_step_ms_mean"] * sparse["windows"]).sum())
    return [
        f"the GPU timeline of rank(s) {short_list(sparse['rank'])} is almost empty: its step "
        f"windows span {_duration(span)} against {_duration(cpu)} of CPU "
        f"steps ({span / cpu:.2%}; a trace of CUDA graph capture, or GPU activity the profiler "
        "did not record): its bubble numbers describe those few events, not the job"
    ]


_TIME = (0.0, float("inf"))
_SHARE_PCT = (0.0, 100.0)
_HTA_RANGES = {
    "temporal_breakdown": {
        "idle_time_us": _TIME,
        "compute_time_us": _TIME,
        "non_compute_time_us": _TIME,
        "kernel_time_us": _TIME,
        "idle_time_pctg": _SHARE_PCT,
        "compute_time_pctg": _SHARE_PCT,
        "non_compute_time_pctg": _SHARE_PCT,
    },
    "comm_comp_overlap": {"comp_comm_overlap_pctg": _SHARE_PCT},
    "idle_time_breakdown": {"idle_time_us": _TIME, "idle_time_ratio": (0.0, 1.0)},
}
"""The range of every HTA-rule value: times >= 0, percentages 0-100, ratios 0-1."""


def hta_out_of_range(analysis: Analysis) -> list[dict[str, Any]]:
    """The HTA-rule values outside their range (``table``, ``rank``, ``column``, ``value``):
    HTA's rounding of out-of-order or sub-µs events can give a negative time or a share above
    100% (:mod:`fsobs.analysis.hta_compat`, rule 4). They are kept as the rules give them."""
    hta = analysis.hta
    if hta is None:
        return []
    flagged = []
    for name, ranges in _HTA_RANGES.items():
        frame: pd.DataFrame = getattr(hta, name)
        for column, (low, high) in ranges.items():
            if column not in frame:
                continue
            values = frame[column]
            bad = (values < low) | (values > high)
            for rank, value in zip(frame.loc[bad, "rank"], values[bad], strict=True):
                flagged.append(
                    {"table": name, "rank": plain(rank), "column": column, "value": plain(value)}
                )
    return flagged


def hta_flag_lines(analysis: Analysis) -> list[str]:
    """One line per flagged HTA-rule value (:func:`hta_out_of_range`)."""
    return [
        f"[yellow]flagged:[/] {f['table']} of rank {f['rank']}: {f['column']} = {f['value']} "
        "is out of range (out-of-order or sub-µs events rounded by HTA's rules; HTA itself "
        "stops on a negative time): shown as the rules give it"
        for f in hta_out_of_range(analysis)
    ]
