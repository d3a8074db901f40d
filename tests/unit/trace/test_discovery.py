"""Trace discovery in a run folder (issue 25): the JSON files that are not Kineto traces (a
user's ``losses.json``) are left out with one note; traces are taken by name or by their
opening bytes (:mod:`fsobs.trace._sniff`), damaged ones still reported."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import fsobs
from fsobs.cli import main
from fsobs.trace._sniff import SNIFF_BYTES
from tests.support.kineto import step, trace, write, write_allreduce_run

NOTE = (
    "not read as traces: {} (JSON without traceEvents, schemaVersion, distributedInfo or ph "
    "in its first 64 KiB)"
)


def _analyze(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["analyze", "--json", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_other_json_in_a_run_folder_is_left_out_with_one_note(tmp_path, capsys):
    write_allreduce_run(tmp_path, [(100, 60), (80, 120)])
    (tmp_path / "losses.json").write_text(json.dumps([0.69, 0.52, 0.41]))
    (tmp_path / "metrics.json.gz").write_bytes(gzip.compress(b'{"auc": 0.71, "step": 2}'))
    code, out, err = _analyze(tmp_path, capsys)
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["run"]["warnings"] == [NOTE.format("losses.json, metrics.json.gz")]
    assert report["run"]["steps"] == [1, 2]
    # write_allreduce_run's windows: step 1 the slower rank's 100 µs + 50, the last step
    # 120 + 20 (it ends with its all_reduce); the median of the two
    assert report["summary"]["step_time_ms_p50"] == pytest.approx((150 + 140) / 2 / 1000)


def test_traces_are_taken_by_their_opening_whatever_their_name(tmp_path):
    """Kineto's own key order (``schemaVersion`` first), a document with ``traceEvents`` alone,
    and the markers past 64 KiB (left out: the rule looks no further)."""
    write(tmp_path / "worker-a.json", trace([step(1, 0, 10)], rank=0, world_size=2))
    events_only = {"traceEvents": [step(1, 0, 10)], "distributedInfo": {"rank": 1}}
    write(tmp_path / "b.json.gz", events_only)
    late = {"padding": "x" * SNIFF_BYTES, **trace([step(1, 0, 10)], rank=1, world_size=2)}
    write(tmp_path / "late.json", late)
    run = fsobs.load_run(tmp_path)
    assert {r: run[r].path.name for r in run.rank_ids} == {0: "worker-a.json", 1: "b.json.gz"}
    assert run.warnings == [NOTE.format("late.json")]


def test_a_damaged_file_named_as_a_trace_is_reported_not_left_out(tmp_path, capsys):
    write_allreduce_run(tmp_path, [(100, 60), (80, 120)])
    path = tmp_path / "rank1.trace.json"
    path.write_bytes(path.read_bytes()[:9])  # '{"schemaV': no marker left
    code, out, err = _analyze(tmp_path, capsys)
    assert (code, out) == (2, "")
    assert (
        err.startswith(f"fsobs: error: {path}: not valid JSON: truncated") and err.count("\n") == 1
    )


def test_a_damaged_gzip_of_any_name_is_reported(tmp_path, capsys):
    path = write(tmp_path / "worker.json.gz", trace([step(1, 0, 10)]))
    data = bytearray(path.read_bytes())
    data[12] ^= 0xFF  # in the deflate stream: its opening cannot be decompressed
    path.write_bytes(bytes(data))
    code, _, err = _analyze(tmp_path, capsys)
    assert code == 2 and err.startswith(f"fsobs: error: {path}: corrupt gzip data"), err


def test_a_folder_of_other_json_only_is_one_line(tmp_path, capsys):
    (tmp_path / "losses.json").write_text("[0.69, 0.52]")
    code, out, err = _analyze(tmp_path, capsys)
    assert (code, out) == (2, "")
    assert err == (
        f"fsobs: error: {tmp_path}: no Kineto trace in this directory; "
        + NOTE.format("losses.json")
        + "\n"
    )
