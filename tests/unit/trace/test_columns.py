"""fsobs.trace._columns on hand-written batches of events: codes across batches, the defaults of
events without args, shape keys, thread names, and kept structs detached from the text."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import pytest

from fsobs.errors import TraceFormatError
from fsobs.trace._columns import ColumnBuilder
from fsobs.trace._decode import decode_event_array

PATH = Path("rank0.json")


def _batch(*events: str) -> bytes:
    return b"[" + ",".join(events).encode() + b"]"


def _add(builder: ColumnBuilder, text: bytes, offset: int = 0) -> None:
    builder.add(decode_event_array(text), offset)


def test_codes_follow_first_appearance_across_batches_none_last_per_batch():
    builder = ColumnBuilder(PATH, 0)
    _add(
        builder,
        _batch(
            '{"ph": "X", "name": "b", "pid": 7, "tid": 1, "ts": 1, "dur": 1}',
            '{"ph": "X", "name": "a", "cat": "cpu_op", "pid": 7, "tid": 1, "ts": 2, "dur": 1}',
            '{"ph": "X", "name": "b", "cat": "kernel", "pid": "7", "tid": 1, "ts": 3, "dur": 1}',
        ),
    )
    _add(
        builder,
        _batch(
            '{"ph": "X", "name": "c", "cat": "kernel", "pid": 8, "tid": 2, "ts": 4, "dur": 1}',
            '{"ph": "X", "name": "a", "cat": "cpu_op", "pid": 7, "tid": 2, "ts": 5, "dur": 1}',
        ),
        offset=3,
    )
    columns = builder.columns()
    assert list(columns["name"]) == ["b", "a", "b", "c", "a"]
    assert list(columns["name"].categories) == ["b", "a", "c"]
    # the first batch's categories in order, then its missing one (None -> NaN)
    assert list(columns["cat"].categories) == ["cpu_op", "kernel"]
    assert columns["cat"].isna().tolist() == [True, False, False, False, False]
    assert list(columns["pid"].categories) == ["7", "8"]  # pid 7 and "7": one category
    assert columns["event_index"].tolist() == [0, 1, 2, 3, 4]


def test_events_without_args_have_no_stream_correlation_or_shape():
    builder = ColumnBuilder(PATH, 0)
    _add(
        builder,
        _batch(
            '{"ph": "X", "name": "aten::mm", "tid": 1, "ts": 10, "dur": 5}',
            '{"ph": "X", "name": "gemm", "cat": "kernel", "tid": 7, "ts": 12, "dur": 2, '
            '"args": {"stream": 7, "correlation": 42, "grid": [4, 1, 1], "block": [128, 1, 1]}}',
            '{"ph": "X", "name": "aten::add", "tid": 1, "ts": 20, "dur": 1, '
            '"args": {"Input Dims": [[2, 3], []], "stream": "x"}}',
        ),
    )
    columns = builder.columns()
    assert columns["stream"].tolist() == [-1, 7, -1]  # "x" is no int: HTA's -1
    assert columns["correlation"].tolist() == [-1, 42, -1]
    assert columns["shape_key"].tolist() == [
        0,
        zlib.crc32(b"|[4, 1, 1]|[128, 1, 1]") + 1,
        zlib.crc32(b"[[2, 3], []]||") + 1,
    ]


def test_thread_names_and_events_without_dur_are_left_out_of_the_table():
    builder = ColumnBuilder(PATH, 0)
    _add(
        builder,
        _batch(
            '{"ph": "M", "name": "thread_name", "pid": 1, "tid": 5, "ts": 0, '
            '"args": {"name": "main"}}',
            '{"ph": "s", "name": "ac2g", "cat": "ac2g", "tid": 5, "ts": 1, "id": 3}',
            '{"ph": "X", "name": "aten::mm", "tid": 5, "ts": 2, "dur": 1.5}',
            '{"ph": "X", "name": "Trace", "cat": "Trace", "tid": 5, "ts": 0, "dur": 99}',
        ),
    )
    assert builder.thread_names == {"5": "main"}
    columns = builder.columns()
    assert columns["event_index"].tolist() == [2]
    assert columns["dur_raw"].tolist() == [1.5]
    assert not builder.hta_round  # every ts an integer
    _add(builder, _batch('{"ph": "X", "name": "a", "tid": 5, "ts": 3.5, "dur": 1}'), offset=4)
    assert builder.hta_round


def test_a_complete_event_without_dur_is_an_error_naming_it():
    builder = ColumnBuilder(PATH, 3)
    with pytest.raises(TraceFormatError, match=r"traceEvents\[11\]\.dur") as error:
        _add(
            builder,
            _batch(
                '{"ph": "i", "name": "mark", "tid": 5, "ts": 1}',
                '{"ph": "X", "name": "aten::mm", "tid": 5, "ts": 2}',
            ),
            offset=10,
        )
    assert "complete event without a duration" in str(error.value)


def test_kept_structs_hold_their_fields_without_the_batch_text():
    text = _batch(
        '{"ph": "X", "name": "aten::mm", "tid": 1, "ts": 1, "dur": 1}',
        '{"ph": "X", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cat": "kernel", '
        '"tid": 7, "ts": 2, "dur": 3, "args": {"stream": 7, "Collective name": "allreduce", '
        '"In msg nelems": 1024, "Group size": 2, "dtype": "Float"}}',
        '{"ph": "X", "name": "record_param_comms", "cat": "cpu_op", "tid": 1, "ts": 1, '
        '"dur": 4, "args": {"Seq": 3, "Process Group Ranks": [0, 1]}}',
    )
    before = sys.getrefcount(text)
    builder = ColumnBuilder(PATH, 0)
    _add(builder, text)
    assert sys.getrefcount(text) == before  # nothing kept points into the text
    assert sorted(builder.structs) == [1, 2]
    kernel, comms = builder.structs[1], builder.structs[2]
    assert (kernel.name, kernel.cat, kernel.ts, kernel.dur) == (
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "kernel",
        2,
        3,
    )
    assert kernel.args is not None and comms.args is not None
    assert bytes(kernel.args.coll_name) == b'"allreduce"'
    assert bytes(kernel.args.in_nelems) == b"1024"
    assert bytes(kernel.args.group_size) == b"2"
    assert bytes(kernel.args.dtype) == b'"Float"'
    assert not kernel.args.seq and kernel.args.stream == 7
    assert bytes(comms.args.seq) == b"3"
    assert bytes(comms.args.pg_ranks) == b"[0, 1]"  # the text as it was
