"""Step sidecars: records round-trip through the writer and the strict reader; an interrupted
writer stays analyzable."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fsobs.errors import TraceFormatError
from fsobs.runformat import (
    SidecarWriter,
    StepRecord,
    finalize_incomplete,
    read_run_json,
    read_sidecars,
    read_step_lengths,
)
from fsobs.runformat.steps import MAX_LISTED_LENGTHS, recover_partial


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_round_trip_small_and_large_steps(tmp_path):
    small = [5, 3, 9]
    listed = list(range(MAX_LISTED_LENGTHS))
    large = [7] * 5000 + [300]
    with SidecarWriter(tmp_path, 1) as writer:
        writer.write(StepRecord.of(0, small, 12.5, 1_000, 2_000))
        writer.write(StepRecord.of(1, listed, None, 2_000, 3_000))
        writer.write(StepRecord.of(2, large, 4.0e7, 3_000, 9_000))
        assert writer.partial_path.exists() and not writer.path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.rank1.jsonl"]
    raw = _lines(writer.path)
    assert raw[0] == {
        "step": 0,
        "num_samples": 3,
        "seq_lengths": small,
        "est_cost": 12.5,
        "wall_start_ns": 1_000,
        "wall_end_ns": 2_000,
    }
    assert len(raw[1]["seq_lengths"]) == MAX_LISTED_LENGTHS
    assert "seq_lengths" not in raw[2]
    assert (raw[2]["len_sum"], raw[2]["len_max"]) == (35_300, 300)

    frame = read_sidecars(tmp_path)
    assert frame["rank"].tolist() == [1, 1, 1]
    assert frame["step"].tolist() == [0, 1, 2]
    assert frame["num_samples"].tolist() == [3, MAX_LISTED_LENGTHS, 5001]
    assert frame["len_sum"].tolist() == [17, sum(listed), 35_300]
    assert frame["len_sq_sum"].tolist() == [115, sum(v * v for v in listed), 5000 * 49 + 90_000]
    assert frame["len_max"].tolist() == [9, MAX_LISTED_LENGTHS - 1, 300]
    assert frame["est_cost"][0] == 12.5 and math.isnan(frame["est_cost"][1])


def test_tensor_and_numpy_lengths(tmp_path):
    torch = pytest.importorskip("torch")

    assert StepRecord.of(0, torch.tensor([3, 4]), 1.0, 0, 1).to_json()["seq_lengths"] == [3, 4]
    assert StepRecord.of(0, np.array([3, 4], dtype=np.int64), None, 0, 1).to_json()[
        "seq_lengths"
    ] == [3, 4]


@pytest.mark.parametrize(
    "args, field",
    [
        ((-1, [1], None, 0, 1), "step"),
        ((0, [1, -2], None, 0, 1), "seq length"),
        ((0, [1.5], None, 0, 1), "seq length"),
        ((0, [1], float("nan"), 0, 1), "est_cost"),
        ((0, [1], None, 5, 4), "wall_end_ns"),
        ((True, [1], None, 0, 1), "step"),
    ],
)
def test_bad_records_are_refused(args, field):
    with pytest.raises(ValueError, match=field):
        StepRecord.of(*args)


def test_steps_must_increase(tmp_path):
    with SidecarWriter(tmp_path, 0) as writer:
        writer.write(StepRecord.of(3, [1], None, 0, 1))
        with pytest.raises(ValueError, match="must increase"):
            writer.write(StepRecord.of(3, [1], None, 1, 2))


def test_refuses_to_overwrite(tmp_path):
    SidecarWriter(tmp_path, 0).close()
    with pytest.raises(FileExistsError, match="steps.rank0.jsonl"):
        SidecarWriter(tmp_path, 0)


def test_exception_leaves_the_partial_file(tmp_path):
    with pytest.raises(RuntimeError), SidecarWriter(tmp_path, 0) as writer:
        writer.write(StepRecord.of(0, [1, 2], None, 0, 1))
        raise RuntimeError("rank died")
    assert [p.name for p in tmp_path.iterdir()] == ["steps.rank0.jsonl.partial"]
    assert read_sidecars(tmp_path) is None  # an unfinished file is never read as finished


def test_interrupted_writer_is_recovered_by_finalize(tmp_path):
    done = SidecarWriter(tmp_path, 0)
    for step in range(3):
        done.write(StepRecord.of(step, [4, 4], 1.0, step, step + 1))
    done.close()
    killed = SidecarWriter(tmp_path, 1)  # never closed: the process "dies"
    for step in range(2):
        killed.write(StepRecord.of(step, [2, 6], 2.0, step, step + 1))
    with open(killed.partial_path, "a", encoding="utf-8") as handle:
        handle.write('{"step": 2, "num_samples": 2, "seq_len')  # torn last line
    assert killed.partial_path.exists()

    meta = finalize_incomplete(tmp_path)

    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["run.json", "steps.rank0.jsonl", "steps.rank1.jsonl"]
    frame = read_sidecars(tmp_path)
    assert frame.groupby("rank")["step"].apply(list).to_dict() == {0: [0, 1, 2], 1: [0, 1]}
    assert meta.status == "incomplete" and meta.ranks_present == ()
    assert "ranks [1] were never closed, 1 torn line(s) dropped" in meta.reason
    assert read_run_json(tmp_path) == meta
    killed.abandon()


def test_balance_fields_and_step_lengths(tmp_path):
    for rank, lengths in ((0, [4, 9]), (1, [30, 1])):
        with SidecarWriter(tmp_path, rank) as writer:
            writer.write(StepRecord.of(0, lengths, 2.0, 0, 5, loss=0.5))
            writer.write(
                StepRecord.of(
                    1,
                    lengths[::-1],
                    2.0,
                    5,
                    9,
                    imbalance_before=1.5,
                    imbalance_after=1.01,
                    batch_digest="ab12",
                )
            )
    frame = read_sidecars(tmp_path)
    step1 = frame[frame["step"] == 1]
    assert step1["imbalance_before"].tolist() == [1.5, 1.5]
    assert step1["imbalance_after"].tolist() == [1.01, 1.01]
    assert step1["batch_digest"].tolist() == ["ab12", "ab12"]
    step0 = frame[frame["step"] == 0]
    assert step0["loss"].tolist() == [0.5, 0.5]
    assert step0["imbalance_before"].isna().all() and step0["batch_digest"].isna().all()
    lengths = read_step_lengths(tmp_path, 1)
    assert {r: v.tolist() for r, v in lengths.items()} == {0: [9, 4], 1: [1, 30]}
    assert read_step_lengths(tmp_path, 7) == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [("imbalance_before", 0.5), ("imbalance_after", float("inf")), ("batch_digest", "")],
)
def test_bad_balance_fields(field, value):
    with pytest.raises(ValueError, match=field):
        StepRecord.of(0, [1], 1.0, 0, 1, **{field: value})


GOOD = (
    '{"step":0,"num_samples":1,"seq_lengths":[3],"est_cost":1.0,"wall_start_ns":0,"wall_end_ns":1}'
)


@pytest.mark.parametrize(
    "line, wanted",
    [
        ("[1, 2]", "must be a JSON object, got list"),
        (
            '{"step": 1, "num_samples": 2, "seq_lengths": [3]}',
            "seq_lengths: lists 1 samples, num_samples 2",
        ),
        ('{"step": 1, "seq_lengths": [1.5]}', "seq_lengths: must be an integer"),
        ('{"step": 1, "seq_lengths": [1], "est_cost": Infinity}', "est_cost: must be finite"),
        ('{"step": 1, "seq_lengths": [1], "loss": 1e400}', "loss: must be finite"),
        ('{"step": -1, "seq_lengths": [1]}', "step: must be >= 0"),
        (
            '{"step": 1, "seq_lengths": [1], "est_costs": 2.0}',
            r"est_costs: unknown field; expected one of \['step', ",
        ),
        ('{"step": 1, "num_samples": 3}', "len_sum: required, but missing"),
        ('{"seq_lengths": [1]}', "step: required, but missing"),
        (
            '{"step": 1, "seq_lengths": [1], "gc_count": 1.0}',
            "gc_count: must be an integer, got 1.0",
        ),
        (
            '{"step": 1, "seq_lengths": [1], "batch_digest": 7}',
            "batch_digest: must be a string, got 7",
        ),
        ('{"step": 1, "seq_lengths": "12"}', "seq_lengths: must be a list"),
        ("{", "bad step record"),
    ],
)
def test_reader_names_file_rank_and_line(tmp_path, line, wanted):
    path = tmp_path / "steps.rank3.jsonl"
    path.write_text(GOOD + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=wanted) as info:
        read_sidecars(tmp_path)
    error = info.value
    assert (error.path, error.rank, error.field) == (str(path), 3, "line 2")
    assert "\n" not in str(error)


def test_written_records_read_back_equal(tmp_path):
    records = [
        StepRecord.of(0, [5, 1], 3.0, 10, 20, loss=0.25, gc_count=2, gc_ms=1.5, nivcsw=4),
        StepRecord.of(1, [7] * (MAX_LISTED_LENGTHS + 1), None, 20, 35, batch_digest="ff"),
    ]
    with SidecarWriter(tmp_path, 0) as writer:
        for record in records:
            writer.write(record)
    again = [StepRecord.from_json(json.loads(line)) for line in _text_lines(writer.path)]
    assert again[0] == records[0]
    big = again[1]  # only the sums were written
    assert big.seq_lengths is None and records[1].seq_lengths is not None
    assert (big.len_sum, big.len_sq_sum, big.len_max) == (
        7 * (MAX_LISTED_LENGTHS + 1),
        49 * (MAX_LISTED_LENGTHS + 1),
        7,
    )


def _text_lines(path):
    return path.read_text().splitlines()


def test_id_overlap_round_trips_and_is_absent_where_not_given(tmp_path):
    """Written after batch_digest; numpy floats and any mapping accepted; read back equal; the
    frame's column holds the dict, None for a record without it (an older sidecar's line)."""
    shares = {"t_item": np.float64(0.75), "t_cat": 1.0, "t_user": 0}
    with SidecarWriter(tmp_path, 0) as writer:
        writer.write(StepRecord.of(0, [2], 1.0, 0, 5, batch_digest="aa"))
        writer.write(StepRecord.of(1, [3], 1.0, 5, 9, batch_digest="bb", id_overlap=shares))
    raw = _lines(writer.path)
    assert "id_overlap" not in raw[0]
    assert list(raw[1])[-2:] == ["batch_digest", "id_overlap"]
    assert raw[1]["id_overlap"] == {"t_item": 0.75, "t_cat": 1.0, "t_user": 0.0}
    again = [StepRecord.from_json(line) for line in raw]
    assert again[0].id_overlap is None
    assert again[1].id_overlap == {"t_item": 0.75, "t_cat": 1.0, "t_user": 0.0}
    assert again[1] == StepRecord.of(1, [3], 1.0, 5, 9, batch_digest="bb", id_overlap=shares)
    frame = read_sidecars(tmp_path)
    assert frame["id_overlap"].tolist() == [None, {"t_item": 0.75, "t_cat": 1.0, "t_user": 0.0}]
    old = tmp_path / "old"
    old.mkdir()
    (old / "steps.rank0.jsonl").write_text(GOOD + "\n")
    assert read_sidecars(old)["id_overlap"].tolist() == [None]


@pytest.mark.parametrize(
    ("value", "wanted"),
    [
        ("{}", "id_overlap: must be a non-empty object"),
        ("[0.5]", "id_overlap: must be a non-empty object"),
        ('{"t_item": 1.5}', r"id_overlap.t_item: must be a share in \[0, 1\]"),
        ('{"t_item": -0.1}', r"id_overlap.t_item: must be a share in \[0, 1\]"),
        ('{"t_item": NaN}', r"id_overlap.t_item: must be finite"),
        ('{"t_item": true}', r"id_overlap.t_item: must be a number"),
        ('{"t_item": "0.5"}', r"id_overlap.t_item: must be a number"),
        ('{"": 0.5}', "table names must be non-empty strings"),
    ],
)
def test_bad_id_overlap_is_refused_naming_the_field(tmp_path, value, wanted):
    path = tmp_path / "steps.rank0.jsonl"
    path.write_text(GOOD + "\n" + GOOD[:-1] + f',"step":1,"id_overlap":{value}}}' + "\n")
    with pytest.raises(TraceFormatError, match=wanted) as info:
        read_sidecars(tmp_path)
    assert info.value.field == "line 2"
    with pytest.raises(ValueError, match="id_overlap"):
        StepRecord.of(0, [1], 1.0, 0, 1, id_overlap=json.loads(value))


def test_sample_ids_round_trip_beside_the_lengths_and_are_left_out_with_them(tmp_path):
    """The dataset index of each sample, in the lengths' order; a step too large to list its
    lengths lists no ids either; a record without ids reads back as None."""
    large = 5000
    with SidecarWriter(tmp_path, 0) as writer:
        writer.write(StepRecord.of(0, [4, 2], 1.0, 0, 5, sample_ids=np.array([17, 3])))
        writer.write(StepRecord.of(1, [1] * large, 1.0, 5, 9, sample_ids=range(large)))
        writer.write(StepRecord.of(2, [5], 1.0, 9, 12))
    raw = _lines(writer.path)
    assert raw[0]["sample_ids"] == [17, 3] and raw[0]["seq_lengths"] == [4, 2]
    assert "sample_ids" not in raw[1] and "seq_lengths" not in raw[1]
    assert "sample_ids" not in raw[2]
    again = StepRecord.from_json(raw[0])
    assert again.sample_ids == (17, 3)
    frame = read_sidecars(tmp_path)
    assert frame["sample_ids"][0].tolist() == [17, 3]
    assert frame["sample_ids"][1] is None and frame["sample_ids"][2] is None


@pytest.mark.parametrize(
    ("ids", "wanted"),
    [([1], "sample_ids: lists 1 samples, num_samples 2"), ([1, -1], "sample_ids: must be >= 0")],
)
def test_bad_sample_ids_are_refused(ids, wanted):
    with pytest.raises(ValueError, match=wanted):
        StepRecord.of(0, [3, 4], 1.0, 0, 1, sample_ids=ids)
    line = {"step": 0, "seq_lengths": [3, 4], "sample_ids": ids}
    with pytest.raises(ValueError, match=wanted):
        StepRecord.from_json(line)


def test_recover_partial_keeps_the_whole_records_before_the_first_torn_line(tmp_path):
    """Read a line at a time: the records up to the first line that is not one are published
    (blank lines skipped, a line longer than the reader's 1 MiB chunk kept whole), that line
    and every non-blank one after it dropped and counted, the partial file and no temporary
    file left."""
    long = '{"step": 1, "note": "' + "x" * (3 * 2**20) + '"}'
    lines = ['{"step": 0}', "", long, '{"step": 2, "num_sam', "", '{"step": 3}', "[1, 2]"]
    partial = tmp_path / "steps.rank0.jsonl.partial"
    partial.write_text("\n".join(lines) + "\n")
    assert recover_partial(partial) == 3  # the torn line, step 3, the list
    assert (tmp_path / "steps.rank0.jsonl").read_text() == '{"step": 0}\n' + long + "\n"
    assert [p.name for p in tmp_path.iterdir()] == ["steps.rank0.jsonl"]

    whole = tmp_path / "steps.rank1.jsonl.partial"
    whole.write_bytes(b'{"step": 0}\n{"step": 1}')  # the last line has no newline yet
    assert recover_partial(whole) == 0
    assert (tmp_path / "steps.rank1.jsonl").read_bytes() == b'{"step": 0}\n{"step": 1}\n'
