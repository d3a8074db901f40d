"""Memory bounded by the input, not by the limit: what reading a trace allocates.

Measured with :mod:`tracemalloc` (every buffer the readers make is a Python object), on files
of ``SPACES`` bytes of whitespace and a small trace: the whole-file read holds the text once
(a growing buffer: at most 1/8 over, plus a piece or two of
:data:`fsobs.trace._decode.PIECE` bytes), the streaming read a few pieces whatever the file's
size, and the default limit of 4 GiB reserves nothing. ``benchmarks/bench_load_memory.py``
measures the same as peak RSS.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fsobs.errors import TraceFormatError, TraceReadError
from fsobs.trace import LoadConfig, load_rank
from fsobs.trace._decode import PIECE, read_trace_bytes
from fsobs.trace._stream import EventStream
from tests.support.kineto import step, trace, x

MiB = 2**20
SPACES = 48 * MiB
TRACE = json.dumps(trace([step(1, 0, 100), x("aten::mm", "cpu_op", 10, 50)])).encode()


def peak_bytes(work: Callable[[], object]) -> int:
    """Peak of the bytes allocated while ``work`` runs, above what was allocated before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.fixture
def padded(tmp_path: Path) -> Iterator[Path]:
    """``SPACES`` bytes of spaces, then the trace, gzipped (a 48 KiB file)."""
    path = tmp_path / "padded.json.gz"
    path.write_bytes(gzip.compress(b" " * SPACES + TRACE, compresslevel=1))
    yield path


def test_the_limit_reserves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(TRACE))
    default_limit = LoadConfig().max_trace_bytes
    assert default_limit == 4 * 2**30
    assert peak_bytes(lambda: read_trace_bytes(path, default_limit)) < MiB


def test_the_whole_file_read_holds_the_text_once(padded: Path) -> None:
    got: list[bytes | bytearray] = []
    peak = peak_bytes(lambda: got.append(read_trace_bytes(padded, 16 * 2**30)))
    assert got[0] == b" " * SPACES + TRACE
    assert peak < 1.125 * (SPACES + len(TRACE)) + 2 * PIECE


def test_the_streaming_read_holds_a_few_pieces(padded: Path) -> None:
    stream = EventStream(padded, 16 * 2**30, 16 * 2**30)
    chunks: list[bytes] = []
    assert peak_bytes(lambda: chunks.extend(stream)) < 4 * PIECE
    names = [event["name"] for chunk in chunks for event in json.loads(chunk)]
    assert names == ["ProfilerStep#1", "aten::mm"]


def test_a_trace_after_whitespace_loads_in_bounded_memory(padded: Path) -> None:
    events: list[int] = []
    peak = peak_bytes(lambda: events.append(len(load_rank(padded).events)))
    assert events == [2] and peak < 4 * PIECE + 4 * MiB


def test_whitespace_alone_is_refused_holding_the_text_at_most_once(tmp_path: Path) -> None:
    path = tmp_path / "blank.json.gz"
    path.write_bytes(gzip.compress(b" " * SPACES, compresslevel=1))
    errors: list[str] = []

    def load() -> None:
        with pytest.raises(TraceFormatError) as info:
            load_rank(path)
        errors.append(str(info.value))

    assert peak_bytes(load) < 1.125 * SPACES + 3 * PIECE
    assert errors == [f"{path}: empty file"]


def test_over_the_limit_is_one_line_in_bounded_memory(tmp_path: Path) -> None:
    """Two gzip members (the trailer tells only the last one's size): the limit stops the
    decompression itself."""
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b" " * SPACES) + gzip.compress(TRACE))
    errors: list[str] = []

    def load() -> None:
        with pytest.raises(TraceReadError) as info:
            load_rank(path, LoadConfig(max_trace_bytes=SPACES // 2))
        errors.append(str(info.value))

    assert peak_bytes(load) < 4 * PIECE
    (error,) = errors
    assert error.startswith(f"{path}: decompressed data is over the 24.0 MiB limit per trace")
    assert "\n" not in error
