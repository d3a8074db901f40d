"""The critical path as extra events of ``fsobs export`` (:mod:`fsobs.export`).

Every rank's exported trace gets the whole path of every step (Perfetto opens one file at a
time, so each file carries it all): one process ``fsobs critical path`` under the bubble
tracks, one thread per rank the path visits, one slice per segment, and a flow arrow at each
jump from one rank to another (Chrome trace format: an ``s`` event inside the segment before
the jump, an ``f`` event with ``bp: "e"`` inside the segment after it, one ``id`` per pair)::

    fsobs critical path
      rank 0                        |xx|=c=|
      rank 1   |=====b=====|--------^              the late rank's work, then the collective

Times are the path's (the aligned clock) put on the file's rank's own clock.
"""

from __future__ import annotations

import json

import pandas as pd

from fsobs.analysis.critical_path.path import CriticalPath
from fsobs.analysis.summary import RankSummary
from fsobs.simulate.kineto_writer import us

PID = "fsobs critical path"
CATEGORY = "fsobs_critical_path"
FLOW_NAME = "critical path"
SORT_INDEX = -999  # right under the bubble tracks (fsobs.export.SORT_INDEX)


def path_events(trace: RankSummary, path: CriticalPath, offset_ns: int) -> list[str]:
    """The JSON text of the path's events in ``trace``'s file (``offset_ns``: what the
    matching subtracted from this rank's clock)."""
    segments = path.segments
    if segments.empty:
        return []
    base = (trace.base_time_ns or 0) if trace.time_format == "relative-us" else 0
    shift = offset_ns - base
    ts0 = us(int(segments["start_ns"].min()) + shift)
    events = [
        _meta("process_name", ts0, 0, {"name": PID}),
        _meta("process_sort_index", ts0, 0, {"sort_index": SORT_INDEX}),
    ]
    for rank in sorted(segments["rank"].unique().tolist()):
        events.append(_meta("thread_name", ts0, _tid(rank), {"name": f"rank {rank}"}))
        events.append(_meta("thread_sort_index", ts0, _tid(rank), {"sort_index": rank}))
    events.extend(_slices(segments, shift))
    events.extend(_flows(segments, shift))
    return events


def _tid(rank: int) -> str:
    return f"rank {rank}"


def _meta(name: str, ts: str, tid: int | str, args: dict[str, object]) -> str:
    return (
        f'{{"ph": "M", "name": "{name}", "pid": "{PID}", "tid": {json.dumps(tid)}, '
        f'"ts": {ts}, "args": {json.dumps(args)}}}'
    )


def _slices(segments: pd.DataFrame, shift: int) -> list[str]:
    out = []
    for step, rank, kind, name, lo, hi in segments[
        ["step", "rank", "kind", "name", "start_ns", "end_ns"]
    ].itertuples(index=False):
        args = {"step": int(step), "rank": int(rank), "kind": kind, "name": name}
        title = f"{kind} {name}" if name else kind
        out.append(
            f'{{"ph": "X", "cat": "{CATEGORY}", "name": {json.dumps(title)}, "pid": "{PID}", '
            f'"tid": "{_tid(int(rank))}", "ts": {us(int(lo) + shift)}, '
            f'"dur": {us(int(hi) - int(lo))}, "args": {json.dumps(args)}}}'
        )
    return out


def _flows(segments: pd.DataFrame, shift: int) -> list[str]:
    """One ``s``/``f`` pair per jump: consecutive segments of a step on different ranks."""
    out: list[str] = []
    rows = segments[["step", "rank", "start_ns"]].itertuples(index=False)
    prev = None
    for step, rank, start in rows:
        if prev is not None and prev[0] == step and prev[1] != rank:
            flow = len(out) // 2
            out.append(_flow("s", flow, int(prev[1]), int(prev[2]) + shift))
            out.append(_flow("f", flow, int(rank), int(start) + shift))
        prev = (step, rank, start)
    return out


def _flow(phase: str, flow: int, rank: int, ts_ns: int) -> str:
    binding = ', "bp": "e"' if phase == "f" else ""
    return (
        f'{{"ph": "{phase}", "cat": "{CATEGORY}", "name": "{FLOW_NAME}", "id": {flow}, '
        f'"pid": "{PID}", "tid": "{_tid(rank)}", "ts": {us(ts_ns)}{binding}}}'
    )
