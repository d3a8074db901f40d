"""A corpus of malformed inputs, each with the one-line error it must produce.

Every case is built in ``tmp_path`` from a valid minimal Kineto trace, loaded with
:func:`fsobs.load_run`, and must raise exactly the expected :class:`~fsobs.errors.FsobsError`
subclass with a one-line message that names the file, the rank when it is known and the field
when there is one. ``fsobs analyze`` on the same input must exit 2 with one line on stderr.

An ``X`` (complete) event without ``dur`` is an error, not an instant: Kineto always writes
``dur`` on complete events, and dropping the event would silently change the answer.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fsobs import errors as E
from fsobs.cli import main
from fsobs.trace import LoadConfig, load_run, loader
from tests.support.kineto import MAIN_TID, step, thread_name, x
from tests.support.kineto import trace as kineto_trace

MiB = 2**20
GiB = 2**30
Doc = dict[str, Any]

# -- builders -------------------------------------------------------------------------------


def trace(rank: int | None = 0, world_size: int | None = 1) -> Doc:
    """Valid and minimal: a thread name, ProfilerStep#1 and two cpu_ops (traceEvents[2], [3])."""
    events = [
        thread_name(MAIN_TID, "main"),
        step(1, 100, 500),
        x("aten::mm", "cpu_op", 150, 100, External_id=1),
        x("aten::add", "cpu_op", 300.5, 50, External_id=2),
    ]
    return kineto_trace(events, rank=rank, world_size=world_size)


def with_event(**change: Any) -> Doc:
    """The minimal trace with traceEvents[3] changed; a value of ``...`` deletes the key."""
    doc = trace()
    event = doc["traceEvents"][3]
    for key, value in change.items():
        if value is ...:
            del event[key]
        else:
            event[key] = value
    return doc


def with_info(**change: Any) -> Doc:
    doc = trace()
    doc["distributedInfo"].update(change)
    return doc


def text(doc: Doc | list[Any]) -> bytes:
    return json.dumps(doc).encode()  # float("nan") and float("inf") become NaN and Infinity


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def valid_gz() -> bytes:
    return gz(text(trace()))


def corrupt_gz() -> bytes:
    data = bytearray(valid_gz())
    for i in range(12, 20):  # the deflate stream, right after the 10-byte header
        data[i] ^= 0x5A
    return bytes(data)


def claims_2gib() -> bytes:
    """A valid gzip whose trailer (ISIZE) claims 2 GiB of uncompressed data."""
    return valid_gz()[:-4] + (2 * GiB).to_bytes(4, "little")


def bomb() -> bytes:
    """5 MB of spaces, then the trace, as two gzip members: the last trailer claims little."""
    return gz(b" " * 5_000_000) + valid_gz()


def file(name: str, content: Callable[[], bytes | Doc]) -> Callable[[Path], Path]:
    """Builder of one trace file ``name``; a dict is written as JSON text."""

    def build(tmp: Path) -> Path:
        data = content()
        (tmp / name).write_bytes(text(data) if isinstance(data, dict) else data)
        return tmp / name

    return build


def run(
    files: dict[str, Doc], meta: bytes | None = None, steps: bytes | None = None
) -> Callable[[Path], Path]:
    """Builder of a run directory of gzipped traces, with ``run.json`` when ``meta`` is given
    and rank 0's step sidecar when ``steps`` is."""

    def build(tmp: Path) -> Path:
        root = tmp / "run"
        root.mkdir()
        for name, doc in files.items():
            (root / name).write_bytes(gz(text(doc)))
        if meta is not None:
            (root / "run.json").write_bytes(meta)
        if steps is not None:
            (root / "steps.rank0.jsonl").write_bytes(steps)
        return root

    return build


def sidecar(line: bytes) -> Callable[[Path], Path]:
    """A one-rank run whose step sidecar is ``line``."""
    return run({"r0.json.gz": trace(0, 1)}, steps=line + b"\n")


DEEP = b"[" * 1200 + b"1" + b"]" * 1200
"""Nested deeper than Python's recursion limit (1000)."""


def deep_args() -> bytes:
    return text(with_event(args={"stream": 7, "deep": "@"})).replace(b'"@"', DEEP)


def step_named(name: str) -> Doc:
    doc = trace()
    doc["traceEvents"][1]["name"] = name
    return doc


# -- the corpus -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Path], Path]
    """Writes the input under tmp_path and returns the path given to the loader."""
    error: type[E.FsobsError]
    expect: tuple[str, ...] = ()
    """Parts of the message besides the file, rank and field."""
    rank: int | None = None
    field: str | None = None
    max_bytes: int | None = None
    """LoadConfig.max_trace_bytes (``--max-trace-gb`` for the CLI); None: the default."""


WS2 = b'{"world_size": 2, "status": "complete"}'
CASES = [
    # the file cannot be read
    Case("nonexistent-path", lambda tmp: tmp / "nope.json", E.TraceReadError, ("no such file",)),
    Case("empty-directory", lambda tmp: tmp, E.EmptyRunError, ("no trace files",)),
    Case(
        "truncated-gzip",
        file("r.json.gz", lambda: valid_gz()[: len(valid_gz()) // 2]),
        E.TraceReadError,
        ("truncated gzip file",),
    ),
    Case(
        "gzip-shorter-than-header",
        file("r.json.gz", lambda: valid_gz()[:12]),
        E.TraceReadError,
        ("truncated gzip file",),
    ),
    Case("corrupt-gzip", file("r.json.gz", corrupt_gz), E.TraceReadError, ("corrupt gzip data",)),
    Case(
        "gzip-claims-2gib-over-limit",
        file("r.json.gz", claims_2gib),
        E.TraceReadError,
        ("gzip trailer claims 2.0 GiB", "over the 1.0 GiB limit", "--max-trace-gb"),
        max_bytes=1 * GiB,
    ),
    Case(
        "gzip-claims-2gib-wrong-length",
        file("r.json.gz", claims_2gib),
        E.TraceReadError,
        ("corrupt gzip data (incorrect length",),
    ),
    Case(
        "gzip-bomb",
        file("r.json.gz", bomb),
        E.TraceReadError,
        ("decompressed data is over the 1.0 MiB limit",),
        max_bytes=1 * MiB,
    ),
    Case(
        "gzip-too-big-by-its-trailer",
        file("r.json.gz", lambda: gz(b" " * 5_000_000 + text(trace()))),
        E.TraceReadError,
        ("gzip trailer claims 4.8 MiB", "over the 1.0 MiB limit"),
        max_bytes=1 * MiB,
    ),
    Case(
        "plain-file-too-big",
        file("r.json", lambda: b" " * 2 * MiB + text(trace())),
        E.TraceReadError,
        ("file is 2.0 MiB", "over the 1.0 MiB limit"),
        max_bytes=1 * MiB,
    ),
    # not JSON, or not a Kineto trace
    Case("empty-file", file("r.json", lambda: b""), E.TraceFormatError, ("empty file",)),
    Case(
        "not-json",
        file("r.json", lambda: b"this is not a trace\n"),
        E.TraceFormatError,
        ("not valid JSON: invalid character at line 1, column 5",),
    ),
    Case(
        "truncated-json",
        file("r.json", lambda: text(trace())[:200]),
        E.TraceFormatError,
        ("not valid JSON: truncated",),
    ),
    Case(
        "trailing-garbage",
        file("r.json", lambda: text(trace()) + b"\n}"),
        E.TraceFormatError,
        ("not valid JSON: trailing characters at line 2",),
    ),
    Case(
        "non-utf8-string",
        file("r.json", lambda: text(trace()).replace(b"aten::add", b"aten::add\xff\xfe")),
        E.TraceFormatError,
        ("not UTF-8 text: invalid byte 0xff at line 1", r"aten::add\xff\xfe"),
        rank=0,
    ),
    Case(
        "top-level-list",
        file("r.json", lambda: text(trace()["traceEvents"])),
        E.TraceFormatError,
        ("not a Kineto trace: expected an object, got an array",),
    ),
    Case(
        "no-traceEvents",
        file("r.json", lambda: {"distributedInfo": {"rank": 0, "world_size": 1}}),
        E.TraceFormatError,
        ("missing",),
        rank=0,
        field="traceEvents",
    ),
    Case(
        "traceEvents-not-a-list",
        file("r.json", lambda: {**trace(), "traceEvents": {"ph": "X"}}),
        E.TraceFormatError,
        ("expected an array, got an object",),
        rank=0,
        field="traceEvents",
    ),
    Case(
        "event-not-an-object",
        file("r.json", lambda: {**trace(), "traceEvents": [*trace()["traceEvents"], 5]}),
        E.TraceFormatError,
        ("expected an object, got an integer",),
        rank=0,
        field="traceEvents[4]",
    ),
    # bad event values
    Case(
        "x-event-without-ts",
        file("r.json", lambda: with_event(ts=...)),
        E.TraceFormatError,
        ("complete event without a timestamp",),
        rank=0,
        field="traceEvents[3].ts",
    ),
    Case(
        "x-event-without-dur",
        file("r.json", lambda: with_event(dur=...)),
        E.TraceFormatError,
        ("complete event without a duration",),
        rank=0,
        field="traceEvents[3].dur",
    ),
    Case(
        "negative-dur",
        file("r.json", lambda: with_event(dur=-5)),
        E.TraceFormatError,
        ("negative duration: -5.0",),
        rank=0,
        field="traceEvents[3].dur",
    ),
    Case(
        "nan-token",
        file("r.json", lambda: with_event(dur=float("nan"))),
        E.TraceFormatError,
        ("not valid JSON: NaN is not a JSON number at line 1", '"dur": NaN'),
    ),
    Case(
        "infinity-token",
        file("r.json", lambda: with_event(ts=float("-inf"))),
        E.TraceFormatError,
        ("not valid JSON: Infinity is not a JSON number", '"ts": -Infinity'),
    ),
    Case(
        "nan-string-ts",
        file("r.json.gz", lambda: gz(text(with_event(ts="NaN")))),
        E.TraceFormatError,
        ("expected a number, got a string",),
        rank=0,
        field="traceEvents[3].ts",
    ),
    Case(
        "ts-as-string",
        file("r.json", lambda: with_event(ts="300.5")),
        E.TraceFormatError,
        ("expected a number, got a string",),
        rank=0,
        field="traceEvents[3].ts",
    ),
    Case(
        "ts-1e999",
        file("r.json", lambda: text(with_event(ts=271828)).replace(b"271828", b"1e999")),
        E.TraceFormatError,
        ("number out of range",),
        rank=0,
        field="traceEvents[3].ts",
    ),
    Case(
        "ts-beyond-int64",
        file("r.json", lambda: with_event(ts=2**64)),
        E.TraceFormatError,
        ("out of range: 1.8446744073709552e+19",),
        rank=0,
        field="traceEvents[3].ts",
    ),
    Case(
        "dur-overflows-ns",
        file("r.json", lambda: with_event(dur=1e300)),
        E.TraceFormatError,
        ("out of range: 1e+300",),
        rank=0,
        field="traceEvents[3].dur",
    ),
    Case(
        "base-time-out-of-range",
        file("r.json", lambda: {**trace(), "baseTimeNanoseconds": 2**70}),
        E.TraceFormatError,
        ("out of range",),
        rank=0,
        field="baseTimeNanoseconds",
    ),
    Case(
        "correlation-wrong-type",
        file("r.json", lambda: with_event(args={"correlation": "12"})),
        E.TraceFormatError,
        ("expected an integer, got a string",),
        rank=0,
        field="traceEvents[3].args.correlation",
    ),
    Case(
        "correlation-beyond-int64",
        file("r.json", lambda: with_event(args={"correlation": 2**64})),
        E.TraceFormatError,
        ("out of range",),
        rank=0,
        field="traceEvents[3].args.correlation",
    ),
    # bad distributedInfo
    Case(
        "rank-as-string",
        file("r.json", lambda: with_info(rank="0")),
        E.TraceFormatError,
        ("expected an integer, got a string",),
        field="distributedInfo.rank",
    ),
    Case(
        "negative-rank",
        file("r.json", lambda: with_info(rank=-1)),
        E.TraceFormatError,
        ("rank must be >= 0, got -1",),
        field="distributedInfo.rank",
    ),
    Case(
        "rank-not-below-world-size",
        file("r2.json", lambda: with_info(rank=2, world_size=2)),
        E.TraceFormatError,
        ("rank 2 is outside world_size 2",),
        rank=2,
        field="distributedInfo.world_size",
    ),
    # the files are not one consistent run
    Case(
        "duplicate-ranks",
        run({"a.json.gz": trace(0, 2), "b.json.gz": trace(0, 2)}),
        E.DuplicateRankError,
        ("both a.json.gz and b.json.gz claim this rank",),
        rank=0,
        field="distributedInfo.rank",
    ),
    Case(
        "mixed-world-sizes",
        run({"r0.json.gz": trace(0, 2), "r1.json.gz": trace(1, 4)}),
        E.WorldSizeMismatchError,
        ("world_size 2 in r0.json.gz (rank 0) but 4 in r1.json.gz (rank 1)",),
        field="distributedInfo.world_size",
    ),
    Case(
        "multi-file-without-rank",
        run({"r0.json.gz": trace(0, 2), "r1.json.gz": trace(None)}),
        E.TraceFormatError,
        ("r1.json.gz", "missing; needed to tell the ranks of a multi-file run apart"),
        field="distributedInfo.rank",
    ),
    Case(
        "missing-rank",
        run({"r0.json.gz": trace(0, 2)}, WS2),
        E.MissingRankError,
        ("run.json says the run of 2 ranks is complete but rank 1 has no trace",),
        rank=1,
    ),
    Case(
        "run-json-world-size-mismatch",
        run({"r0.json.gz": trace(0, 2), "r1.json.gz": trace(1, 2)}, b'{"world_size": 4}'),
        E.WorldSizeMismatchError,
        ("run.json", "run.json says world_size 4 but the traces say 2"),
        field="world_size",
    ),
    Case(
        "run-json-world-size-string",
        run({"r0.json.gz": trace(0, 1)}, b'{"world_size": "1"}'),
        E.TraceFormatError,
        ("run.json", "world_size: must be an integer, got '1'"),
        field="world_size",
    ),
    Case(
        "run-json-not-json",
        run({"r0.json.gz": trace(0, 1)}, b'{"world_size": 1,'),
        E.TraceFormatError,
        ("run.json", "run metadata is not valid JSON", "line 1, column 18"),
    ),
    Case(
        "run-json-not-an-object",
        run({"r0.json.gz": trace(0, 1)}, b"[1]"),
        E.TraceFormatError,
        ("run.json", "run metadata must be a JSON object"),
    ),
    # hostile values (issue 25): each was a traceback
    Case(
        "args-nested-1200-deep",
        file("r.json", deep_args),
        E.TraceFormatError,
        ("not valid JSON for fsobs: arrays or objects nested deeper than Python's recursion",),
        rank=0,
    ),
    Case(
        "gz-args-nested-1200-deep",
        file("r.json.gz", lambda: gz(deep_args())),
        E.TraceFormatError,
        ("nested deeper than Python's recursion limit",),
        rank=0,
    ),
    Case(
        "event-without-name",
        file("r.json", lambda: with_event(name=...)),
        E.TraceFormatError,
        ("complete event without a name",),
        rank=0,
        field="traceEvents[3].name",
    ),
    Case(
        "event-without-tid",
        file("r.json", lambda: with_event(tid=...)),
        E.TraceFormatError,
        ("complete event without a thread (tid)",),
        rank=0,
        field="traceEvents[3].tid",
    ),
    Case(
        "step-number-of-20-digits",
        file("r.json", lambda: step_named("ProfilerStep#12345678901234567890")),
        E.TraceFormatError,
        ("step number out of range (at most 2147483647)", "ProfilerStep#12345678901234567890"),
        rank=0,
        field="traceEvents[1].name",
    ),
    Case(
        "step-number-of-5000-digits",
        file("r.json", lambda: step_named("ProfilerStep#" + "9" * 5000)),
        E.TraceFormatError,
        ("step number out of range",),
        rank=0,
        field="traceEvents[1].name",
    ),
    Case(
        "stream-1e23-as-text",
        file("r.json", lambda: with_event(args={"stream": "1" + "0" * 23})),
        E.TraceFormatError,
        ("out of range: 1" + "0" * 23,),
        rank=0,
        field="traceEvents[3].args.stream",
    ),
    Case(
        "stream-1e23-as-integer",
        file("r.json", lambda: with_event(args={"stream": 10**23})),
        E.TraceFormatError,
        ("out of range: 1" + "0" * 23,),
        rank=0,
        field="traceEvents[3].args.stream",
    ),
    Case(
        "stream-1e23-as-float",
        file("r.json", lambda: with_event(args={"stream": 1e23})),
        E.TraceFormatError,
        ("expected an integer or a string, got a float",),
        rank=0,
        field="traceEvents[3].args.stream",
    ),
    Case(
        "world-size-beyond-any-run",
        file("r.json", lambda: with_info(world_size=2**40)),
        E.TraceFormatError,
        (f"{2**40} is beyond any run (at most 1048576 ranks)",),
        field="distributedInfo.world_size",
    ),
    Case(
        "sidecar-line-not-an-object",
        sidecar(b"[1]"),
        E.TraceFormatError,
        ("steps.rank0.jsonl", "a step record must be a JSON object, got list"),
        rank=0,
        field="line 1",
    ),
    Case(
        "sidecar-infinity",
        sidecar(b'{"step": 1, "seq_lengths": [3], "est_cost": Infinity}'),
        E.TraceFormatError,
        ("est_cost: must be finite, got inf",),
        rank=0,
        field="line 1",
    ),
    Case(
        "sidecar-1e400",
        sidecar(b'{"step": 1e400, "seq_lengths": [3]}'),
        E.TraceFormatError,
        ("step: must be an integer, got inf",),
        rank=0,
        field="line 1",
    ),
    Case(
        "sidecar-lengths-1e300",
        sidecar(b'{"step": 1, "seq_lengths": [1e300]}'),
        E.TraceFormatError,
        ("seq_lengths: must be an integer, got 1e+300",),
        rank=0,
        field="line 1",
    ),
    Case(
        "sidecar-length-beyond-int64",
        sidecar(b'{"step": 1, "seq_lengths": [100000000000000000000]}'),
        E.TraceFormatError,
        ("seq_lengths: must be < 2**63, got 100000000000000000000",),
        rank=0,
        field="line 1",
    ),
    Case(
        "sidecar-num-samples-not-the-lengths",
        sidecar(b'{"step": 1, "num_samples": 3, "seq_lengths": [3]}'),
        E.TraceFormatError,
        ("seq_lengths: lists 1 samples, num_samples 3",),
        rank=0,
        field="line 1",
    ),
    Case(
        "sidecar-nested-1200-deep",
        sidecar(b'{"step": 1, "seq_lengths": [3], "id_overlap": ' + DEEP + b"}"),
        E.TraceFormatError,
        ("nested deeper than Python's recursion limit",),
        rank=0,
        field="line 1",
    ),
    Case(
        "run-json-toggles-not-an-object",
        run({"r0.json.gz": trace(0, 1)}, b'{"toggles": [1]}'),
        E.TraceFormatError,
        ("run.json", "toggles: must be an object, got [1]"),
        field="toggles",
    ),
    Case(
        "run-json-toggle-not-an-object",
        run({"r0.json.gz": trace(0, 1)}, b'{"toggles": {"balance": 1}}'),
        E.TraceFormatError,
        ("run.json", "must be an object, got 1"),
        field="toggles.balance",
    ),
    Case(
        "run-json-nested-1200-deep",
        run({"r0.json.gz": trace(0, 1)}, b'{"workload": ' + DEEP + b"}"),
        E.TraceFormatError,
        ("run.json", "nested deeper than Python's recursion limit"),
    ),
    Case(
        "run-json-world-size-beyond-any-run",
        run({"r0.json.gz": trace(0, 1)}, b'{"world_size": 100000000000000000000}'),
        E.TraceFormatError,
        ("run.json", "expected at most 1048576 ranks, got 100000000000000000000"),
        field="world_size",
    ),
]


# -- tests ----------------------------------------------------------------------------------


def config(max_bytes: int | None) -> LoadConfig:
    return LoadConfig() if max_bytes is None else LoadConfig(max_trace_bytes=max_bytes)


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 24
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_load_raises_one_line_naming_file_rank_field(case: Case, tmp_path: Path) -> None:
    path = case.build(tmp_path)
    with pytest.raises(E.FsobsError) as info:
        load_run(path, config(case.max_bytes))
    err = info.value
    message = str(err)
    assert type(err) is case.error, message
    assert message == " ".join(message.split()), "one line, no stray whitespace"
    assert err.path is not None and path.name in message
    assert (err.rank, err.field) == (case.rank, case.field), message
    if case.rank is not None:
        assert f": rank {case.rank}: " in message
    if case.field is not None:
        assert f": field {case.field}: " in message
    for part in case.expect:
        assert part in message


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_cli_exits_2_with_one_line(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = case.build(tmp_path)
    limit = [] if case.max_bytes is None else ["--max-trace-gb", repr(case.max_bytes / GiB)]
    assert main(["analyze", *limit, str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("fsobs: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert path.name in err


def test_the_minimal_trace_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in (file("r.json", trace)(tmp_path), file("r.json.gz", valid_gz)(tmp_path)):
        loaded = load_run(path)
        assert loaded.world_size == 1 and list(loaded.ranks) == [0] and not loaded.warnings
        assert len(loaded.ranks[0].events) == 3
        assert main(["analyze", str(path)]) == 0
    assert capsys.readouterr().err == ""


def test_the_bomb_is_a_valid_trace_without_a_limit(tmp_path: Path) -> None:
    assert len(load_run(file("r.json.gz", bomb)(tmp_path)).ranks[0].events) == 3


def test_error_from_a_worker_process_keeps_class_path_rank_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loader, "_PARALLEL_MIN_BYTES", 0)
    pools: list[int] = []
    real_pool = loader.ProcessPoolExecutor

    def pool(*args: Any, **kwargs: Any) -> Any:
        pools.append(kwargs["max_workers"])
        return real_pool(*args, **kwargs)

    monkeypatch.setattr(loader, "ProcessPoolExecutor", pool)
    bad = trace(1, 2)
    bad["traceEvents"][3]["dur"] = -5
    root = run({"r0.json.gz": trace(0, 2), "r1.json.gz": bad})(tmp_path)
    with pytest.raises(E.TraceFormatError) as info:
        load_run(root, LoadConfig(workers=2))
    assert pools == [2], "the parallel path was not taken"
    err = info.value
    assert (err.path, err.rank, err.field) == (str(root / "r1.json.gz"), 1, "traceEvents[3].dur")
    assert str(err) == f"{err.path}: rank 1: field traceEvents[3].dur: negative duration: -5.0"
