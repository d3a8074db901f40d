"""``fsobs export``: the run's traces with the bubble classes drawn as extra tracks.

Each rank's trace is written again as ``rank<R>.trace.json.gz``: every original top-level value
and every original event is copied byte for byte, and new events are appended to
``traceEvents``: one process ``fsobs bubbles (rank R)`` sorted on top, one thread per bubble
class, and one complete (``X``) slice per interval of that class::

    python            |op|op|        (blocked)            |op|
    fsobs bubbles
      straggler_wait           |......|
      exposed_comm                    |xxxxx|
      host_idle

Timestamps use the trace's own time base (microseconds relative to ``baseTimeNanoseconds``, or
absolute microseconds for old traces), written as exact decimals (ns precision). The output
directory is itself a run (``run.json``, ``job.json`` and ``steps.rank*.jsonl`` are copied), so
it loads again with :func:`fsobs.trace.load_run`; Perfetto and chrome://tracing open the files
as is.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import BinaryIO

import msgspec

from fsobs.analysis.bubbles.classify import StepBubbles
from fsobs.analysis.bubbles.store import BubbleStore
from fsobs.analysis.critical_path.path import CriticalPath
from fsobs.analysis.summary import RankSummary
from fsobs.errors import ExportError, TraceFormatError
from fsobs.export_path import path_events
from fsobs.runformat.atomic import publish, temp_path
from fsobs.runformat.names import JOB_JSON, RUN_JSON, sidecar_file_name, trace_file_name
from fsobs.simulate.kineto_writer import us
from fsobs.trace._decode import DEFAULT_MAX_TRACE_BYTES, read_trace_bytes
from fsobs.trace.schema import Run

__all__ = ["export_rank", "export_run"]

PID = "fsobs bubbles"
CATEGORY = "fsobs_bubble"
TRACKS = ("straggler_wait", "exposed_comm", "host_idle")
"""Always drawn; ``unattributed_comm`` and ``other`` are drawn too when a rank has any."""
SORT_INDEX = -1000  # Kineto sorts CPU processes by pid and GPUs above 2**24: this goes on top
GZIP_LEVEL = 6


def export_run(
    run: Run[RankSummary],
    bubbles: BubbleStore,
    out_dir: Path,
    *,
    overwrite: bool = False,
    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES,
    critical_path: CriticalPath | None = None,
    offsets_ns: dict[int, int] | None = None,
) -> list[Path]:
    """Write every rank's trace with bubble tracks to ``out_dir``; return the written paths.
    With ``critical_path`` (and the matching's clock ``offsets_ns``), every trace also gets
    the path (:mod:`fsobs.export_path`).

    Refuses (:class:`ExportError`) when ``out_dir`` holds the run's own files, or when files it
    would write already exist (unless ``overwrite``), before writing anything.
    """
    out_dir = Path(out_dir)
    plan = _plan(run, out_dir, overwrite)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for rank in run.rank_ids:
        trace = run[rank]
        target = out_dir / trace_file_name(rank)
        extra = bubble_events(trace, bubbles.of_rank(rank))
        if critical_path is not None:
            extra += path_events(trace, critical_path, (offsets_ns or {}).get(rank, 0))
        _atomic_write(
            target,
            partial(_write_trace, trace=trace, extra=extra, max_bytes=max_trace_bytes),
            gz=True,
        )
        written.append(target)
    for source in plan:
        target = out_dir / source.name
        _atomic_write(target, partial(_copy, source=source), gz=False)
        written.append(target)
    return written


def export_rank(
    trace: RankSummary,
    steps: list[StepBubbles],
    *,
    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES,
) -> bytes:
    """One rank's trace with its bubble tracks, gzipped: the bytes :func:`export_run` writes to
    that rank's file (a download, without writing the whole run)."""
    buffer = io.BytesIO()
    name = trace_file_name(trace.rank).removesuffix(".gz")
    with gzip.GzipFile(name, "wb", GZIP_LEVEL, buffer, mtime=0) as out:
        _write_trace(out, trace, bubble_events(trace, steps), max_trace_bytes)  # type: ignore[arg-type]  # GzipFile is binary IO
    return buffer.getvalue()


def bubble_events(trace: RankSummary, steps: list[StepBubbles]) -> list[str]:
    """The JSON text of the events added to ``trace``: metadata, then one slice per interval.

    One thread per class. Step windows tile the timeline and the intervals of one class are
    disjoint inside a window, so the slices of a thread never overlap (viewers need that).
    """
    base = (trace.base_time_ns or 0) if trace.time_format == "relative-us" else 0
    tracks = list(TRACKS)
    tracks += [
        name
        for name in ("unattributed_comm", "other")
        if any(sb.total_ns(name) > 0 for sb in steps)
    ]
    first = min((sb.window[0] for sb in steps), default=base)
    ts0 = us(first - base)
    meta = [
        _meta("process_name", ts0, None, {"name": f"fsobs bubbles (rank {trace.rank})"}),
        _meta("process_labels", ts0, None, {"labels": "bubble classes (fsobs)"}),
        _meta("process_sort_index", ts0, None, {"sort_index": SORT_INDEX}),
    ]
    slices: list[str] = []
    for order, name in enumerate(tracks):
        meta.append(_meta("thread_name", ts0, name, {"name": name}))
        meta.append(_meta("thread_sort_index", ts0, name, {"sort_index": order}))
        pieces = sorted(
            (int(lo), int(hi), sb.step)
            for sb in steps
            for lo, hi in zip(*(a.tolist() for a in sb.classes[name]), strict=True)
            if hi > lo
        )
        slices.extend(_slice(name, name, lo - base, hi - lo, step) for lo, hi, step in pieces)
    return meta + slices


def _meta(name: str, ts: str, tid: str | None, args: dict[str, object]) -> str:
    tid_text = json.dumps(tid if tid is not None else 0)
    return (
        f'{{"ph": "M", "name": {json.dumps(name)}, "pid": {json.dumps(PID)}, '
        f'"tid": {tid_text}, "ts": {ts}, "args": {json.dumps(args)}}}'
    )


def _slice(name: str, tid: str, start_ns: int, dur_ns: int, step: int) -> str:
    args = {"step": step, "class": name, "dur_ms": round(dur_ns / 1e6, 6)}
    return (
        f'{{"ph": "X", "cat": "{CATEGORY}", "name": {json.dumps(name)}, '
        f'"pid": {json.dumps(PID)}, "tid": {json.dumps(tid)}, '
        f'"ts": {us(start_ns)}, "dur": {us(dur_ns)}, '
        f'"args": {json.dumps(args, allow_nan=False)}}}'
    )


def _write_trace(out: BinaryIO, trace: RankSummary, extra: list[str], max_bytes: int) -> None:
    """Copy the top-level object value by value, appending ``extra`` to ``traceEvents``."""
    data = read_trace_bytes(trace.path, max_bytes, held=False)
    try:
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.DecodeError as exc:
        raise TraceFormatError(
            f"cannot re-read the trace for export: {exc}", path=trace.path, rank=trace.rank
        ) from exc
    if "traceEvents" not in top:
        raise TraceFormatError("missing", path=trace.path, rank=trace.rank, field="traceEvents")
    out.write(b"{")
    for i, (key, raw) in enumerate(top.items()):
        out.write(b", " if i else b"")
        out.write(msgspec.json.encode(key) + b": ")
        if key == "traceEvents":
            _write_events(out, memoryview(raw), extra, trace)
        else:
            out.write(memoryview(raw))
    out.write(b"}\n")


def _write_events(out: BinaryIO, events: memoryview, extra: list[str], trace: RankSummary) -> None:
    # a memoryview compares equal to bytes of the same content
    if len(events) < 2 or events[0:1] != b"[" or events[-1:] != b"]":  # type: ignore[comparison-overlap]
        raise TraceFormatError(
            "not a JSON array", path=trace.path, rank=trace.rank, field="traceEvents"
        )
    last = len(events) - 2  # the last non-blank byte before the closing bracket
    while last > 0 and events[last : last + 1] in (b" ", b"\n", b"\r", b"\t"):  # type: ignore[comparison-overlap]
        last -= 1
    out.write(events[:-1])
    if extra:
        out.write(b",\n" if last > 0 else b"\n")
        out.write(",\n".join(extra).encode())
        out.write(b"\n")
    out.write(b"]")


def _copy(out: BinaryIO, source: Path) -> None:
    with source.open("rb") as f:
        shutil.copyfileobj(f, out)


def _plan(run: Run[RankSummary], out_dir: Path, overwrite: bool) -> list[Path]:
    """Check ``out_dir``; return the run files to copy along (run.json, steps.rank*.jsonl)."""
    paths = [run.path, *(run[r].path for r in run.rank_ids)]
    local = [p for p in paths if isinstance(p, Path)]
    if len(local) < len(paths):
        raise ExportError("export reads local runs only (copy the run here first)", path=run.path)
    run_dir = local[0] if local[0].is_dir() else local[0].parent
    inputs = {run_dir} | {p.parent for p in local[1:]}
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError("exists and is not a directory", path=out_dir)
    if out_dir.exists() and any(out_dir.samefile(p) for p in inputs if p.exists()):
        raise ExportError("is the run's own directory; export into another directory", path=out_dir)
    extra = [run_dir / RUN_JSON] if run.meta is not None else []
    extra += [run_dir / JOB_JSON, *(run_dir / sidecar_file_name(r) for r in run.rank_ids)]
    extra = [p for p in extra if p.is_file()]
    if not out_dir.exists():
        return extra
    names = {trace_file_name(r) for r in run.rank_ids} | {p.name for p in extra}
    existing = sorted(n for n in names if (out_dir / n).exists())
    if existing and not overwrite:
        shown = ", ".join(existing[:3]) + (" ..." if len(existing) > 3 else "")
        raise ExportError(
            f"already holds {shown}; use --overwrite (overwrite=True) to replace",
            path=out_dir,
        )
    foreign = sorted(
        p.name
        for p in out_dir.iterdir()
        if p.is_file() and p.name not in names and p.name.endswith((".json", ".json.gz"))
    )
    if foreign:  # another run's traces or run.json would make OUT an inconsistent run
        shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise ExportError(
            f"holds other run files ({shown}) that would mix with the export; "
            "use an empty directory",
            path=out_dir,
        )
    return extra


def _atomic_write(target: Path, write: Callable[[BinaryIO], None], *, gz: bool) -> None:
    """Write ``target`` through a temporary file in the same directory, then rename it."""
    temp = temp_path(target)
    try:
        with open(temp, "xb") as raw:
            if gz:
                name = target.name.removesuffix(".gz")
                with gzip.GzipFile(name, "wb", GZIP_LEVEL, raw, mtime=0) as out:
                    write(out)  # type: ignore[arg-type]  # GzipFile is binary IO
            else:
                write(raw)
        publish(temp, target)
    finally:
        temp.unlink(missing_ok=True)
